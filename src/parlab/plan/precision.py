"""Honest precision: each predicted step carries the error band the lab measured for that kind
of prediction, candidates inside the top one's band are ties, and no digit is printed beyond
what the band supports.

The bands (``bands.json``, written by the accuracy benchmarks) are the 90th percentile of the
absolute relative error the lab's own tables measured:

- ``built-in``: the built-in compute model against published large-scale runs
  (``benchmarks/plan_published.py``: each run's published layout, predicted as published);
- ``fitted``: the model fitted on a results folder (``--roofline``) against the GPU runs whose
  step the GPU sets, predicted before they ran (``benchmarks/plan_accuracy.py``);
- ``mfu``: one assumed MFU, against the same published runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Band:
    """A relative error band and what it was measured on."""

    kind: str
    """``built-in``, ``fitted`` or ``mfu``."""
    rel: float
    """The band's half-width, as a fraction of the prediction."""
    measured_on: str
    """The table it comes from and how many predictions."""

    def digits(self) -> int:
        """Significant digits the band supports (two at 10 %, three at 1 %)."""
        return max(1, math.ceil(-math.log10(max(self.rel, 1e-6))) + 1)

    def fmt(self, x: float) -> str:
        """``x`` to the digits the band supports (``1.2e+04`` style never: plain digits)."""
        if x == 0 or not math.isfinite(x):
            return f"{x:g}"
        d = self.digits() - 1 - math.floor(math.log10(abs(x)))
        value = round(x, d)
        return f"{value:,.{max(0, d)}f}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rel": self.rel, "measured_on": self.measured_on}


@cache
def bands() -> dict[str, Band]:
    """The shipped bands (``bands.json``); a kind not yet measured is absent."""
    text = resources.files("parlab.plan").joinpath("bands.json").read_text()
    data = json.loads(text)
    return {k: Band(kind=k, **v) for k, v in data.get("bands", {}).items()}


def band_for(kind: str) -> Band | None:
    """The band of one kind of prediction, or None where the lab has not measured it."""
    return bands().get(kind)


def overlaps(a: float, b: float, rel: float) -> bool:
    """Whether ``a`` and ``b`` (predicted tokens/s) lie within each other's band."""
    return a * (1 + rel) >= b * (1 - rel) and b * (1 + rel) >= a * (1 - rel)


def nodes_crossed(cand: Any, gpus_per_node: int) -> int:
    """How many of the candidate's parallel axes have groups that span nodes (rank order pp,
    dp, cp, tp, tp innermost): fewer is less exposed to the network."""
    stride, out = 1, 0
    for axis in ("tp", "cp", "dp", "pp"):
        size = getattr(cand, axis)
        if size > 1 and stride * size > gpus_per_node:
            out += 1
        stride *= size
    return out


def simplicity(cand: Any) -> int:
    """How many moving parts a candidate has: axes over 1, interleaving, recompute, sharding."""
    axes = sum(getattr(cand, a) > 1 for a in ("tp", "pp", "cp", "ep", "dp"))
    return (
        axes
        + (cand.vpp > 1)
        + (cand.recompute != "none")
        + (cand.strategy in ("zero2", "zero3", "fsdp"))
    )
