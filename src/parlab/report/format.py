"""Formatting of values, labels and evidence levels for the report (no plotting, no I/O)."""

from __future__ import annotations

import math
from typing import Any

from parlab.contract import Document, Metric
from parlab.units import format_bytes, format_seconds

LEVEL_MEANING: dict[str, str] = {
    "analytic": "computed from formulas only (ledger, cost model, planner)",
    "cpu-mechanism": "real processes and collectives on the CPU (gloo): correctness and "
    "volumes, not speed",
    "env-precheck": "what the machine is: GPUs, links, versions, a sanity collective",
    "real-nccl": "real collectives on GPUs through NCCL",
    "real-training": "a real model training on GPUs",
    "serving-benchmark": "real requests against real serving replicas",
}
"""One line per evidence level, as DESIGN.md defines them."""

LEVEL_COLOUR: dict[str, str] = {
    "analytic": "#6b7280",
    "cpu-mechanism": "#b45309",
    "env-precheck": "#0e7490",
    "real-nccl": "#15803d",
    "real-training": "#1d4ed8",
    "serving-benchmark": "#7e22ce",
}
"""Badge colour of each evidence level (also used for its bars in figures)."""


def fmt_value(value: float | None, unit: str) -> str:
    """A value with its unit as a person reads it; ``unknown`` for ``None``."""
    if value is None:
        return "unknown"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    v = float(value)
    if unit == "B":
        return format_bytes(v)
    if unit == "s":
        return format_seconds(v) if v >= 0 else f"{v:.3g} s"
    if unit == "B/s":
        return f"{v / 1e9:.2f} GB/s"
    if unit == "bool":
        return "yes" if v else "no"
    if unit == "fraction":
        return f"{100 * v:.2f} %"
    if unit in ("count", "rank") and v == int(v):
        return f"{int(v):,}"
    if abs(v) >= 1000:
        return f"{v:,.0f} {unit}"
    return f"{v:.4g} {unit}"


def fmt_metric(m: Metric) -> str:
    return fmt_value(m.value, m.unit)


def fmt_per_rank(m: Metric) -> str:
    """The per-rank values, in full up to 8 ranks, else min / max."""
    if not m.per_rank:
        return ""
    vals = m.per_rank
    if len(vals) <= 8:
        return ", ".join(fmt_value(v, m.unit) for v in vals)
    known = [v for v in vals if v is not None]
    if not known:
        return f"{len(vals)} ranks, all unknown"
    return (
        f"{len(vals)} ranks: min {fmt_value(min(known), m.unit)}, "
        f"max {fmt_value(max(known), m.unit)}"
    )


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """``(predicted - measured) / measured`` as a fraction; None when either is unknown or 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def fmt_error(err: float | None) -> str:
    return "unknown" if err is None else f"{100 * err:+.1f} %"


def short_id(run_id: str) -> str:
    """The random tail of a run id (``...-1a2b3c``), enough to tell documents apart in plots."""
    return run_id.rsplit("-", 1)[-1]


def layout_label(layout: dict[str, Any]) -> str:
    """``fsdp dp=2 tp=2`` from a document's layout (strategy and the mesh axes above 1)."""
    parts: list[str] = []
    strategy = layout.get("strategy")
    if strategy:
        parts.append(str(strategy))
    mesh = layout.get("mesh")
    if isinstance(mesh, dict):
        parts += [f"{k}={v}" for k, v in mesh.items() if isinstance(v, int) and v > 1]
    if not parts:
        parts.append(f"world={layout.get('world_size')}")
    return " ".join(parts)


def doc_label(doc: Document) -> str:
    """A short label for plots: layout and the run id's tail."""
    return f"{layout_label(doc.layout)} ({short_id(doc.run_id)})"


def gpu_summary(environment: dict[str, Any]) -> str:
    """``2 x NVIDIA H200`` or ``no GPU``, from an environment snapshot."""
    hw = (environment or {}).get("hardware") or {}
    gpus = hw.get("gpus") or []
    if not gpus:
        return "no GPU"
    names = sorted({str(g.get("name")) for g in gpus})
    hosts = hw.get("host_count") or 1
    text = f"{len(gpus)} x {' + '.join(names)}"
    return text + (f" on {hosts} hosts" if hosts and hosts > 1 else "")


def scalar_items(data: dict[str, Any], *, limit: int = 12) -> list[tuple[str, str]]:
    """The short scalar entries of a dict (long lists and nested dicts summarised)."""
    out: list[tuple[str, str]] = []
    for k, v in data.items():
        if isinstance(v, bool) or v is None or isinstance(v, (int, float, str)):
            text = str(v)
            if len(text) > 80:
                text = text[:77] + "..."
        elif isinstance(v, dict):
            if "name" in v and isinstance(v["name"], str):
                text = v["name"]
            else:
                inner = ", ".join(
                    f"{ik}={iv}" for ik, iv in v.items() if isinstance(iv, (int, float, str))
                )
                text = inner[:80] + ("..." if len(inner) > 80 else "") if inner else "{...}"
        elif isinstance(v, list):
            text = (
                ", ".join(str(x) for x in v)
                if len(v) <= 6 and all(isinstance(x, (int, float, str)) for x in v)
                else f"[{len(v)} items]"
            )
        else:
            text = type(v).__name__
        out.append((str(k), text))
        if len(out) >= limit:
            break
    return out
