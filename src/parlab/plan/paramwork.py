"""The per-parameter work's measured bandwidth: the roofline's optimizer and cast terms.

The roofline prices the work done once per parameter per step -- fused AdamW's 28 B a float32
parameter, autocast's 12 B of casts per micro-batch (``parlab.plan.roofline``) -- at the
elementwise ops' fraction of the catalog's HBM bandwidth unless it carries measured bandwidths
(``Roofline.optimizer_bw``, ``Roofline.cast_bw``). ``benchmarks/param_work_probe.py`` measures
them on one GPU apart from any model and writes a ``param-work-calibration`` document under
``PAR-TRAINING-STATE``; this module reads the GPU (``real-training``) ones of the newest one's
device, each bandwidth the mean over them:

- ``optimizer_bw``: the fused AdamW step's bytes / seconds;
- ``cast_bw``: the two casts together, 12 B over the seconds of a weight's cast to bf16 (6 B)
  and a bf16 gradient's back to float32 (6 B).

On one H200 fused AdamW ran at 3.47 TB/s (0.72 of the catalog's 4.8 TB/s) and the casts at
2.0-3.8 TB/s (``results/PAR-TRAINING-STATE/param-work-20261201T0458*``), where the roofline's
fitted elementwise fraction is 0.99. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError

FORMAT = "parlab-param-work/v1"
KIND = "param-work-calibration"
PROJECT = "PAR-TRAINING-STATE"
PREFIX = "param-work"


@dataclass(frozen=True, kw_only=True)
class ParamWork:
    """Measured bandwidths of the per-parameter work on one device."""

    run_ids: tuple[str, ...]
    """The probe documents it rests on."""
    device: str
    optimizer_bw: float
    """Fused AdamW, B/s."""
    cast_bw: float
    """The casts (weight to bf16 and gradient back), B/s."""

    @property
    def label(self) -> str:
        return f"{' + '.join(self.run_ids)} ({self.device})"


def load_param_work(doc: Any) -> ParamWork:
    """The bandwidths one probe document holds; ``UsageError`` when it holds none."""
    body = (doc.workload or {}).get("calibration") or {}
    if doc.workload.get("kind") != KIND or body.get("format") != FORMAT:
        raise UsageError(f"{doc.run_id}: not a {KIND} document ({FORMAT})")
    k = body["kinds"]
    cast_s = 6.0 / k["cast"]["bytes_per_s"] + 6.0 / k["grad_cast"]["bytes_per_s"]
    return ParamWork(
        run_ids=(doc.run_id,),
        device=str(body["device"]),
        optimizer_bw=float(k["adamw"]["bytes_per_s"]),
        cast_bw=12.0 / cast_s,
    )


def param_work_calibration(root: Any) -> ParamWork | None:
    """The GPU (``real-training``) probes under ``root``/PAR-TRAINING-STATE of the newest one's
    device, their bandwidths averaged; None without one."""
    from parlab.plan.host import newest_device_calibrations

    same = newest_device_calibrations(root, PROJECT, PREFIX, load_param_work)
    if not same:
        return None
    return ParamWork(
        run_ids=tuple(r for c in same for r in c.run_ids),
        device=same[-1].device,
        optimizer_bw=sum(c.optimizer_bw for c in same) / len(same),
        cast_bw=sum(c.cast_bw for c in same) / len(same),
    )
