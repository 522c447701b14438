"""Collective sweeps, like for like: the ``{op, size, busbw, time_s, ...}`` rows of
``parlab collectives`` documents, grouped by path (through torch's c10d or NCCL directly, with
or without CUDA graphs, element type, and any NCCL_* variable that differs between the sweeps)
so repeats of one path become one line with a spread."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parlab.contract import Document
from parlab.report.groups import Spread

_SAME_EVERYWHERE = ("NCCL_VERSION",)


def rows(doc: Document) -> list[dict[str, Any]]:
    """The measurement rows of a sweep document (empty when it is none)."""
    found = doc.workload.get("measurements")
    if not isinstance(found, list):
        return []
    return [
        r
        for r in found
        if isinstance(r, dict)
        and isinstance(r.get("size"), (int, float))
        and r["size"] > 0
        and isinstance(r.get("busbw"), (int, float))
        and isinstance(r.get("time_s"), (int, float))
    ]


def _variables(doc: Document) -> dict[str, str]:
    env = (doc.environment or {}).get("variables") or {}
    return {
        k: str(v) for k, v in env.items() if k.startswith("NCCL_") and k not in _SAME_EVERYWHERE
    }


def path_label(row: dict[str, Any], env: dict[str, str]) -> str:
    """``torch``, ``torch + CUDA graph``, ``NCCL direct + bfloat16``, ``torch + NCCL_P2P_DISABLE=1``."""
    parts = ["NCCL direct" if row.get("via") == "nccl" else "torch"]
    if row.get("graph"):
        parts.append("CUDA graph")
    if row.get("type") not in (None, "float"):
        parts.append(str(row["type"]))
    parts += [f"{k}={v}" for k, v in sorted(env.items())]
    return " + ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Curve:
    """One op on one path: per size, the spread of busbw and of time over the sweeps."""

    op: str
    path: str
    busbw: dict[int, Spread]
    time: dict[int, Spread]
    docs: tuple[Document, ...]


def curves(docs: Sequence[Document]) -> list[Curve]:
    """Every (op, path) measured by ``docs``, NCCL variables shown only where they differ."""
    sweeps = [d for d in docs if rows(d)]
    all_env = [_variables(d) for d in sweeps]
    keys = {k for env in all_env for k in env}
    varying = {k for k in keys if len({env.get(k) for env in all_env}) > 1}
    bw: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    tm: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    owners: dict[tuple[str, str], list[Document]] = defaultdict(list)
    for d, env in zip(sweeps, all_env, strict=True):
        shown = {k: v for k, v in env.items() if k in varying}
        for r in rows(d):
            key = (str(r.get("op")), path_label(r, shown))
            bw[key][int(r["size"])].append(float(r["busbw"]))
            tm[key][int(r["size"])].append(float(r["time_s"]))
            if not owners[key] or owners[key][-1] is not d:
                owners[key].append(d)
    out = []
    for key in bw:
        b = {s: sp for s, v in bw[key].items() if (sp := Spread.of(v)) is not None}
        t = {s: sp for s, v in tm[key].items() if (sp := Spread.of(v)) is not None}
        out.append(Curve(op=key[0], path=key[1], busbw=b, time=t, docs=tuple(owners[key])))
    return out


def link_bw(docs: Sequence[Document]) -> float | None:
    """The link's peak per direction the sweeps recorded (``workload.link_bw``, B/s)."""
    vals = [float(v) for d in docs if isinstance(v := d.workload.get("link_bw"), (int, float))]
    return max(vals) if vals else None
