"""The time of one admitted candidate: its step shape, each pipeline stage's roofline work and
wire table, and the step-time estimate (``parlab.plan.estimate``) with what follows from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parlab.ledger.sharding import chunk_sizes
from parlab.ledger.traffic import traffic
from parlab.models.spec import ModelSpec
from parlab.plan.compute import StepShape
from parlab.plan.estimate import StageWork, estimate
from parlab.plan.request import PlanRequest, Verdict
from parlab.plan.roofline import Work, work
from parlab.plan.space import Candidate
from parlab.plan.throughput import Throughput, flops_per_token, mfu_parts
from parlab.topology import Topology


@dataclass(kw_only=True)
class Group:
    """What candidates of one (layout, strategy) share: the layout rows, the states' floor, the
    stages' work and wire tables."""

    bad: str = ""
    topo: Topology | None = None
    floor: float | None = None
    floor_reason: str = ""
    stages: dict[tuple[int, int, str], list[StageWork]] = field(default_factory=dict)
    wires: dict[tuple[int, int, int], list[Any]] = field(default_factory=dict)
    calls: int = 0


def reshards(cand: Candidate) -> bool:
    """FSDP under pipeline parallelism keeps its parameters gathered across micro-batches."""
    return not (cand.strategy == "fsdp" and cand.pp > 1)


def step_shape(req: PlanRequest, cand: Candidate) -> StepShape:
    """``cand``'s shapes, as a compute model looks them up."""
    return StepShape(
        model=req.spec.name,
        micro_batch=cand.micro_batch,
        seq=req.seq,
        tp=cand.tp,
        cp=cand.cp,
        ep=cand.ep,
        gpu=req.cluster.gpu.name,
        recompute=cand.recompute,
    )


def candidate_work(
    req: PlanRequest, cand: Candidate, *, sp: bool, layers: float | None = None, head: bool = True
) -> Work:
    """The roofline's work of one rank's step of ``cand`` (``parlab.plan.roofline.work``):
    ``layers`` blocks (default an even share) and, with ``head``, the output layer."""
    return work(
        req.spec,
        seq=req.seq,
        micro_batch=cand.micro_batch,
        microbatches=cand.microbatches,
        tp=cand.tp,
        pp=cand.pp,
        cp=cand.cp,
        dp=cand.dp,
        strategy=cand.strategy,
        recompute=cand.recompute,
        sp=sp,
        dtype=req.dtype,
        impl=req.implementation,
        layers=layers,
        head=head,
    )


def stage_profiles(spec: ModelSpec, cand: Candidate) -> list[tuple[int, int, bool, int]]:
    """``(representative stage, layers on it, whether it holds the head, how many stages alike)``
    over the pipeline ranks of ``cand`` (``parlab.ledger.sharding.chunk_sizes``)."""
    v_shape = cand.schedule == "zbv"
    v = 2 if v_shape else cand.vpp
    sizes = chunk_sizes(spec.layers, cand.pp * v)
    seen: dict[tuple[int, bool, bool], list[int]] = {}
    for s in range(cand.pp):
        chunks = (s, 2 * cand.pp - 1 - s) if v_shape else tuple(s + c * cand.pp for c in range(v))
        layers = sum(sizes[c] for c in chunks)
        head = s == (0 if v_shape else cand.pp - 1)
        seen.setdefault((layers, head, s == 0), []).append(s)
    return [(ss[0], n, head, len(ss)) for (n, head, _), ss in seen.items()]


def stage_works(req: PlanRequest, cand: Candidate, group: Group, sp: bool) -> list[StageWork]:
    key = (cand.micro_batch, cand.microbatches, cand.recompute)
    if key in group.stages:
        return group.stages[key]
    assert group.topo is not None
    roof = (
        None if isinstance(req.compute, Throughput) else req.compute.roofline(step_shape(req, cand))
    )
    out = []
    for stage, layers, head, count in stage_profiles(req.spec, cand):
        w = candidate_work(req, cand, sp=sp, layers=layers, head=head)
        if roof is None:
            assert isinstance(req.compute, Throughput)
            parts = mfu_parts(w, req.compute)
        else:
            parts = w.parts(roof, req.peak_flops, float(req.cluster.gpu.memory_bw))
        wkey = (cand.micro_batch, cand.microbatches, stage)  # the wire does not see recompute
        if wkey not in group.wires:
            group.wires[wkey] = traffic(
                req.spec, group.topo, cand.strategy, micro_batch=cand.micro_batch,
                seq_len=req.seq, dtype=req.dtype, microbatches=cand.microbatches, sp=sp,
                virtual_stages=cand.vpp, stage=stage, v_shape=cand.schedule == "zbv",
                reshard_after_forward=reshards(cand),
            )  # fmt: skip
        wire = group.wires[wkey]
        out.append(StageWork(stage=stage, count=count, parts=parts, wire=wire))
    group.stages[key] = out
    return out


def timed(req: PlanRequest, cand: Candidate, group: Group, *, peak: float, sp: bool) -> Verdict:
    """An admitted verdict: the step-time estimate and what follows from it."""
    contention = 0.0
    if not isinstance(req.compute, Throughput):
        contention = req.compute.roofline(step_shape(req, cand)).contention
    est = estimate(
        cand,
        stages=stage_works(req, cand, group, sp),
        cluster=req.cluster,
        overlap=req.overlap,
        contention=contention,
    )
    world = req.cluster.count
    tps = req.tokens_per_step / est.step_s / world
    fpt, _ = flops_per_token(req.spec, req.seq)
    return Verdict(
        cand=cand,
        admitted=True,
        peak_bytes=peak,
        estimate=est,
        tokens_per_s_per_gpu=tps,
        mfu=fpt * tps / req.peak_flops if req.peak_flops else None,
        headroom_bytes=req.usable_memory - peak,
    )
