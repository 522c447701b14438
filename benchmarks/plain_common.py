"""Shared helpers of the benchmarks that put parlab's runs beside the plain torch scripts.

``benchmarks/plain_references.py`` writes one JSON per run; the GPU calls commit them as
``results/logs/gpu-<stamp>-plain_references/plain-*.json.log``. Both sides are compared at
the median step time (parlab's documents report the median; the plain script's headline is
the mean over its timed steps, kept as ``tps_mean``), and parlab's runs are paired with the
plain runs of the same GPU call: written within ``CALL_MINUTES`` after the call's stamp.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CALL_MINUTES = 15
"""parlab documents created this long after a call's stamp belong to that call."""


@dataclass(frozen=True)
class PlainRun:
    """One committed plain-script result."""

    path: Path
    stamp: str
    """The GPU call's stamp (``YYYYMMDDTHHMM``, UTC) from its log folder's name."""
    mode: str
    """``fsdp``, ``ddp`` or ``pp``."""
    compile: bool
    schedule: str
    """Pipeline schedule (``-`` outside ``pp``)."""
    model: str
    tps_median: float
    """Tokens/s per GPU at the median step time."""
    tps_mean: float
    """Tokens/s per GPU at the mean step time (the script's headline)."""
    mfu_median: float | None
    """MFU at the median step time (the script's MFU scaled by mean / median)."""

    @property
    def key(self) -> str:
        """The strategy label parlab's training runs use (``fsdp``, ``fsdp+compile``, ...)."""
        return self.mode + ("+compile" if self.compile else "")

    @property
    def start(self) -> dt.datetime:
        return dt.datetime.strptime(self.stamp, "%Y%m%dT%H%M").replace(tzinfo=dt.UTC)

    def same_call(self, doc: Any) -> bool:
        """``doc`` (a parlab contract document) was written in this run's GPU call."""
        created = dt.datetime.fromisoformat(doc.created.replace("Z", "+00:00"))
        return dt.timedelta(0) <= created - self.start <= dt.timedelta(minutes=CALL_MINUTES)


def plain_runs(results: Path, pattern: str = "plain-*.json.log") -> list[PlainRun]:
    """The committed plain-script results under ``results/logs``, oldest call first."""
    out = []
    for f in sorted(results.glob(f"logs/gpu-*-plain_references/{pattern}")):
        ref = json.loads(f.read_text())
        cfg = ref["config"]
        tokens = ref["tokens_per_step"] / ref["world_size"]
        out.append(
            PlainRun(
                path=f,
                stamp=f.parent.name.split("-")[1],  # gpu-<stamp>-plain_references
                mode=ref["mode"],
                compile=bool(cfg.get("compile")),
                schedule=cfg.get("schedule", "-"),
                model=cfg["model"],
                tps_median=tokens / ref["step_s_median"],
                tps_mean=tokens / ref["step_s"],
                mfu_median=(
                    ref["mfu"] * ref["step_s"] / ref["step_s_median"] if ref.get("mfu") else None
                ),
            )
        )
    return out
