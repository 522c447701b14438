"""What a measured run's document records of itself, read for the fit: its knobs, model,
implementation and recompute in the planner's names, and the configuration it repeats
(``group_of``). The fit's modules all read runs through
these; they import nothing else of the fit."""

from __future__ import annotations

import re
from typing import Any

from parlab.ledger.implementation import Implementation


def knobs(doc: Any) -> dict[str, Any]:
    """The layout's knobs (training-state documents) merged over its top level (model-internal)."""
    lay = doc.layout or {}
    return {**lay, **(lay.get("knobs") or {})}


def implementation_of(doc: Any) -> Implementation:
    """What the run's document records of its implementation: ``norm_kernel`` (absent: the
    reference model before it fused RMSNorm and RoPE, ``explicit``), ``compile``, and for
    parlab's sequence parallelism ``sp_saved_input`` (absent: before commit 02e7fd8, when each
    linear copied the gathered sequence, ``sp_gather = "per-linear"``); torch DDP wraps the
    model of ``parlab train --strategy ddp`` on one rank too (``ddp_one_rank``)."""
    k = knobs(doc)
    one = doc.project == "PAR-TRAINING-STATE" and (doc.layout or {}).get("strategy") in (
        "ddp",
        "ddp-bucket",
    )
    old_sp = (
        bool(k.get("sequence_parallel"))
        and k.get("implementation", "parlab") == "parlab"
        and not k.get("sp_saved_input")
    )
    gather = "per-linear" if old_sp else "shared"
    if k.get("compile"):
        return Implementation(norm_kernel="compiled", sp_gather=gather, ddp_one_rank=one)
    norm = str(k.get("norm_kernel") or "explicit")
    return Implementation(norm_kernel=norm, sp_gather=gather, ddp_one_rank=one)


def recompute_of(doc: Any) -> str:
    """The run's recompute in the planner's names: ``parlab train --recompute selective``
    (PAR-TRAINING-STATE documents) ran the runtime's op-level policy, ``op-selective``
    (``parlab.plan.roofline``); the planner's own ``selective`` is Megatron's attention core."""
    rc = str(knobs(doc).get("recompute") or "none")
    if rc == "selective" and doc.project == "PAR-TRAINING-STATE":
        return "op-selective"
    return rc


def gpu_name(doc: Any) -> str:
    """The name of the run's first GPU as its environment records it (``"None"`` where none)."""
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or [{}]
    return str(gpus[0].get("name"))


def model_name(doc: Any) -> str:
    """The catalog name of a run's model (its preset, else its workload's model)."""
    model = doc.workload.get("model")
    return str(
        doc.workload.get("preset") or (model.get("name") if isinstance(model, dict) else model)
    )


_STAMP = re.compile(r"-\d{8}T\d{6}-[0-9a-f]+$")


def group_of(doc: Any) -> str:
    """Runs that repeat one configuration: the run id without its time stamp, the ranks and the
    shape of a rank's batch (``n2-mb2x4096``: one run name covers several), and the knobs that
    change the work (implementation, recompute, resharding, bf16 master weights) or where it
    runs (the ranks' NUMA binding, garbage collection by hand)."""
    k = knobs(doc)
    impl = implementation_of(doc)
    w = doc.workload or {}
    world = (doc.layout or {}).get("world_size")
    mb, seq = w.get("micro_batch"), w.get("seq") or w.get("seq_len")
    parts = [
        _STAMP.sub("", doc.run_id),
        f"n{world}-mb{mb}x{seq}" if world and mb and seq else "",
        impl.norm_kernel,
        str(k.get("recompute") or "none"),
        "keep" if k.get("reshard_after_forward") is False else "",
        # parlab's ZeRO-1/2 with bf16 parameters and fp32 master shards: other work
        "bf16-master" if k.get("dtype") == "bf16-master" else "",
        "sp-per-linear" if impl.sp_gather == "per-linear" else "",
        f"numa-{k['numa_binding']}" if k.get("numa_binding") else "",
        f"gc-{k['manual_gc']}" if k.get("manual_gc") else "",
    ]
    return "/".join(p for p in parts if p)


def is_dtensor_tp(doc: Any) -> bool:
    """torch's DTensor tensor parallelism (``implementation: torch`` at tp > 1)."""
    mesh = (doc.layout or {}).get("mesh") or {}
    return knobs(doc).get("implementation") == "torch" and int(mesh.get("tp", 1)) > 1
