"""What a measured run's document records of itself, read for the fit: its knobs, model,
implementation and recompute in the planner's names. The fit's modules all read runs through
these; they import nothing else of the fit."""

from __future__ import annotations

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


def model_name(doc: Any) -> str:
    """The catalog name of a run's model (its preset, else its workload's model)."""
    model = doc.workload.get("model")
    return str(
        doc.workload.get("preset") or (model.get("name") if isinstance(model, dict) else model)
    )
