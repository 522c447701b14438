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
  and a bf16 gradient's back to float32 (6 B);
- ``bucket_bw``: torch DDP's passes over its gradient buckets together, 24 B over the seconds of
  ``zero_grad`` (4 B), the gradient's accumulation into the kept bucket view (12 B) and the
  bucket's division by the world size (8 B) (``Roofline.bucket_bw``); only probes that timed
  them (``accumulate`` and ``scale``) carry it.

The bandwidths do not depend on the footprint (one H200, 0.5 to 6.7 billion parameters:
``results/PAR-TRAINING-STATE/param-work-20261201T0536*``).
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.plan.elementwise import DDP_BUCKET_PASSES
from parlab.plan.fit.probes import newest_device_calibrations

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
    bucket_bw: float = 0.0
    """torch DDP's bucket passes (zero, accumulate, scale), B/s; 0: not measured."""

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
    bucket_bw = 0.0
    if "accumulate" in k and "scale" in k:
        bucket_s = sum(n / k[kind]["bytes_per_s"] for kind, n in DDP_BUCKET_PASSES.items())
        bucket_bw = sum(DDP_BUCKET_PASSES.values()) / bucket_s
    return ParamWork(
        run_ids=(doc.run_id,),
        device=str(body["device"]),
        optimizer_bw=float(k["adamw"]["bytes_per_s"]),
        cast_bw=12.0 / cast_s,
        bucket_bw=bucket_bw,
    )


def param_work_calibration(root: Any) -> ParamWork | None:
    """The GPU (``real-training``) probes under ``root``/PAR-TRAINING-STATE of the newest one's
    device, their bandwidths averaged; None without one."""
    same = newest_device_calibrations(root, PROJECT, PREFIX, load_param_work)
    if not same:
        return None
    buckets = [c.bucket_bw for c in same if c.bucket_bw]
    return ParamWork(
        run_ids=tuple(r for c in same for r in c.run_ids),
        device=same[-1].device,
        optimizer_bw=sum(c.optimizer_bw for c in same) / len(same),
        cast_bw=sum(c.cast_bw for c in same) / len(same),
        bucket_bw=sum(buckets) / len(buckets) if buckets else 0.0,
    )
