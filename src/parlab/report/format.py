"""Formatting of values, labels, errors and evidence levels for the report (no plotting, no
I/O)."""

from __future__ import annotations

import math

from parlab.contract import Metric
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


ERROR_CONVENTION = (
    "error = (measured - predicted) / predicted, the sign docs/accuracy.md uses: positive "
    "means the run needed more (memory, time, bytes) than predicted"
)
"""The sign of every prediction error the report shows, in words."""


def prediction_error(predicted: float | None, measured: float | None) -> float | None:
    """``(measured - predicted) / predicted`` as a fraction (``ERROR_CONVENTION``); None when
    either is unknown or the prediction is 0."""
    if predicted is None or measured is None or predicted == 0:
        return None
    return (measured - predicted) / predicted


def fmt_error(err: float | None) -> str:
    """A prediction error (``prediction_error``) as a signed percentage, or ``unknown``."""
    return "unknown" if err is None else f"{100 * err:+.1f} %"
