"""``parlab plan``: admit or reject every candidate with a reason, predict, rank, Pareto front.

Admission, in order (the first failing check is the reason, with its ``kind``):

1. ``layout`` -- a row of the layout's constraint table fails
   (``parlab.layout.constraints``: heads/KV heads/FFN/vocab divisible by tp,
   layers by pp x v, sequence by 2 cp, ep dividing dp, tp within a node);
2. ``batch`` -- the global batch is not a whole number of micro-batches of
   ``micro_batch`` sequences on each of the dp ranks, or interleaving has a
   micro-batch count that is not a multiple of pp (Megatron's rule), or the
   zero-bubble V has fewer than 2p - 1 micro-batches (torch's schedule pads to
   that many to fill the V, and the bubble model needs them);
3. ``unsupported`` -- the ledger refuses the layout (its own message);
4. ``memory`` -- the ledger's predicted per-rank peak (``parlab.ledger.predict``)
   exceeds the usable memory, by how much. The states alone (params, grads,
   optimizer, master) are a floor of every peak, so a (layout, strategy) whose
   floor is over is rejected for every micro-batch, recompute and schedule at
   once, "by at least" the floor's excess (sound: no peak is below its floor);
5. ``comm`` -- exposed communication over ``max_exposed_comm`` of the step.

Each admitted candidate gets a predicted step time
(``parlab.plan.estimate``: one MFU, or the roofline of ``parlab.plan.roofline`` when the
request carries one), tokens/s per GPU, MFU and memory headroom. The
ranking is by tokens/s per GPU (ties: less memory, then name); the Pareto
front is every admitted candidate that no other beats on both throughput and
peak memory.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from parlab.errors import UsageError
from parlab.layout import constraints, shape_of
from parlab.ledger import predict
from parlab.ledger.traffic import traffic
from parlab.models.spec import ModelSpec
from parlab.plan.estimate import (
    StepEstimate,
    Throughput,
    estimate,
    flops_per_token,
    recompute_flops_per_token,
    width_factor,
)
from parlab.plan.roofline import Implementation, Roofline, work
from parlab.plan.space import (
    DEFAULT_MICRO_BATCHES,
    DEFAULT_SCHEDULES,
    RECOMPUTE,
    SCHEDULES,
    STRATEGIES,
    Candidate,
    Cluster,
    degree_tuples,
    schedules_for,
)
from parlab.topology import Topology

DEFAULT_MFU = 0.40
"""The assumed MFU when no training document is given (labelled as assumed)."""


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan for."""

    spec: ModelSpec
    """The model."""
    cluster: Cluster
    """The GPUs."""
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    seq: int
    """Tokens per sequence."""
    throughput: Throughput
    """Achieved FLOP/s per GPU (measured or assumed)."""
    micro_batches: tuple[int, ...] = DEFAULT_MICRO_BATCHES
    """Micro-batch sizes to try."""
    strategies: tuple[str, ...] = STRATEGIES
    """Data-parallel strategies to try."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Recompute modes to try."""
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    """Pipeline schedules to try (when pp > 1; ``zbv`` only when asked)."""
    dtype: str = "bf16-mixed"
    """The ledger's dtype policy."""
    optimizer: str = "adamw"
    """The ledger's optimizer."""
    overlap: float = 1.0
    """Fraction of backward compute that non-blocking communication can hide behind."""
    memory_reserve: float = 0.0
    """Fraction of GPU memory kept free (CUDA context, fragmentation)."""
    max_exposed_comm: float | None = None
    """Reject candidates whose exposed communication exceeds this fraction of the step."""
    gemm_width_half: float = 0.0
    """n0 of the GEMM-width efficiency f(n) = n / (n + n0), n = hidden / tp, relative to the
    MFU's own width (``parlab.plan.estimate.width_factor``); 0: a constant MFU."""
    roofline: Roofline | None = None
    """Per-kind efficiencies (``parlab.plan.roofline``): compute as GEMMs + causal attention +
    memory-bound work, communication hidden per mechanism; None: FLOPs / (MFU x peak). It
    carries its own GEMM width law (``gemm_width_half`` above is the MFU model's)."""
    implementation: Implementation = field(default_factory=Implementation)
    """The implementation the roofline's elementwise bytes are counted for."""
    shapes: Any = None
    """A GEMM-shape calibration (``parlab.plan.shapes.GemmShapes``) measured on this cluster's
    GPU: where it covers a candidate's model and batch, its measured factors adjust
    ``roofline`` for that candidate (``candidate_roofline``); None: the roofline as fitted."""

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.seq < 1:
            raise UsageError(
                f"global batch {self.global_batch}, sequence {self.seq}: give positive sizes"
            )
        if self.spec.position == "learned" and self.seq > self.spec.max_seq_len:
            raise UsageError(
                f"sequence {self.seq} exceeds {self.spec.name}'s {self.spec.max_seq_len} learned "
                "positions: plan a shorter --seq"
            )
        if not 0.0 <= self.memory_reserve < 1.0:
            raise UsageError(f"memory reserve {self.memory_reserve}: give a fraction in [0, 1)")
        if self.gemm_width_half < 0:
            raise UsageError(f"GEMM width half {self.gemm_width_half}: give 0 (off) or more")
        if not 0.0 <= self.overlap <= 1.0:
            raise UsageError(f"overlap {self.overlap}: give a fraction in [0, 1]")
        for name, values, allowed in (
            ("strategy", self.strategies, STRATEGIES),
            ("recompute", self.recompute, RECOMPUTE),
            ("schedule", self.schedules, SCHEDULES),
        ):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise UsageError(
                    f"{name} {', '.join(bad) or '(none)'}: use one or more of {', '.join(allowed)}"
                )
        if not self.micro_batches or any(m < 1 for m in self.micro_batches):
            raise UsageError(f"micro-batches {self.micro_batches}: give sizes of at least 1")

    @property
    def usable_memory(self) -> float:
        return self.cluster.gpu.memory_bytes * (1.0 - self.memory_reserve)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One candidate, admitted or rejected."""

    cand: Candidate
    """The candidate."""
    admitted: bool
    """Whether it passed every check."""
    kind: str = ""
    """Why rejected: ``layout``, ``batch``, ``unsupported``, ``memory``, ``comm``."""
    reason: str = ""
    """One line: the check and its numbers."""
    peak_bytes: float | None = None
    """Predicted peak per rank (the floor, for a group rejected on its states)."""
    estimate: StepEstimate | None = None
    """The step-time estimate (admitted, or rejected for comm)."""
    tokens_per_s_per_gpu: float | None = None
    """Predicted throughput."""
    mfu: float | None = None
    """Predicted MFU (model FLOPs, recompute not counted, over the dense bf16 peak)."""
    headroom_bytes: float | None = None
    """Usable memory minus peak."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.cand.to_json(), "admitted": self.admitted}
        if not self.admitted:
            out["kind"] = self.kind
            out["reason"] = self.reason
        out["peak_bytes"] = self.peak_bytes
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_json()
            out["tokens_per_s_per_gpu"] = self.tokens_per_s_per_gpu
            out["mfu"] = self.mfu
            out["headroom_bytes"] = self.headroom_bytes
        return out


@dataclass(kw_only=True)
class PlanResult:
    """Every verdict, ranked, and the front."""

    request: PlanRequest
    """What was planned."""
    ranked: list[Verdict]
    """Admitted candidates, best first."""
    rejected: list[Verdict]
    """Rejected candidates, in search order."""
    pareto: list[Verdict]
    """Admitted candidates no other beats on both throughput and memory (fastest first)."""
    flops_source: str
    """Where FLOPs per token come from."""
    flops_per_token: float
    """Training FLOPs per token, no recompute."""
    elapsed_s: float
    """Search wall time."""
    ledger_calls: int = 0
    """How many times the ledger was asked."""
    notes: list[str] = field(default_factory=list)
    """Assumptions."""

    @property
    def top(self) -> Verdict | None:
        return self.ranked[0] if self.ranked else None

    def rejected_by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.rejected))


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def _stage_floor(ledger: Any) -> float:
    """The largest on-device state bytes (params, grads, optimizer, master) over stages."""
    best = 0.0
    for stage in range(ledger.topology.pp):
        total = 0
        for name in ("params", "grads", "optimizer", "master_params"):
            it = ledger.item(name)
            if it is not None and it.on_device:
                total += it.per_stage[stage]
        best = max(best, total)
    return best


def plan(req: PlanRequest) -> PlanResult:
    """Search the whole candidate space of ``req`` (see the module docstring)."""
    t0 = time.perf_counter()
    spec, cluster = req.spec, req.cluster
    world = cluster.count
    shape = shape_of(spec)
    fpt, fsrc = flops_per_token(spec, req.seq)
    usable = req.usable_memory
    ranked: list[Verdict] = []
    rejected: list[Verdict] = []
    calls = 0
    moe = spec.moe.num_experts if spec.moe is not None else None
    for deg in degree_tuples(world, moe_experts=moe):
        pp, dp, cp, tp, ep = deg["pp"], deg["dp"], deg["cp"], deg["tp"], deg["ep"]
        scheds = [
            (s, v) for s, v in schedules_for(pp, spec.layers) if s == "-" or s in req.schedules
        ]
        for sched, vpp in scheds:
            rows = constraints(
                world=world,
                degrees=deg,
                shape=shape,
                seq=req.seq,
                sequence_parallel=tp > 1,
                gpus_per_node=cluster.gpus_per_node,
                vpp=vpp,
            )
            bad = [r for r in rows if not r.ok]
            layout_reason = "; ".join(f"{r.name} fails ({r.detail})" for r in bad)
            topo = None if bad else Topology(world_size=world, **deg)
            for strategy in req.strategies:
                floor: float | None = None
                floor_reason = ""
                wire_cache: dict[tuple[int, int], dict[int, list[Any]]] = {}
                for mb in req.micro_batches:
                    per_step = dp * mb
                    m = req.global_batch // per_step if req.global_batch % per_step == 0 else 0
                    for rc in req.recompute:
                        cand = Candidate(
                            dp=dp,
                            tp=tp,
                            pp=pp,
                            cp=cp,
                            ep=ep,
                            strategy=strategy,
                            micro_batch=mb,
                            microbatches=max(m, 1),
                            recompute=rc,
                            schedule=sched,
                            vpp=vpp,
                        )
                        if bad:
                            rejected.append(
                                Verdict(
                                    cand=cand, admitted=False, kind="layout", reason=layout_reason
                                )
                            )
                            continue
                        if not m:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="batch",
                                    reason=f"global batch {req.global_batch} is not a multiple "
                                    f"of dp {dp} x micro-batch {mb} = {per_step}",
                                )
                            )
                            continue
                        if sched == "interleaved" and m % pp:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="batch",
                                    reason=f"interleaved schedule needs the {m} micro-batches "
                                    f"to be a multiple of pp {pp}",
                                )
                            )
                            continue
                        if sched == "zbv" and m < 2 * pp - 1:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="batch",
                                    reason=f"zero-bubble V needs at least 2 pp - 1 = {2 * pp - 1} "
                                    f"micro-batches, not {m}",
                                )
                            )
                            continue
                        if floor is not None and floor > usable:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="memory",
                                    reason=floor_reason,
                                    peak_bytes=floor,
                                )
                            )
                            continue
                        assert topo is not None
                        ledger_for = partial(
                            predict,
                            spec,
                            strategy=strategy,
                            topology=topo,
                            micro_batch=mb,
                            seq_len=req.seq,
                            dtype=req.dtype,
                            recompute=rc,
                            pp_schedule="1f1b" if sched == "-" else sched,
                            microbatches=m,
                            virtual_stages=vpp,
                            sp=tp > 1,
                        )
                        try:
                            calls += 1
                            ledger = ledger_for(optimizer=req.optimizer)
                        except ValueError as exc:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="unsupported",
                                    reason=f"ledger: {exc}",
                                )
                            )
                            continue
                        if floor is None:
                            floor = _stage_floor(ledger)
                            floor_reason = (
                                f"over memory by at least {_gb(floor - usable)}: the states alone "
                                f"(params, grads, optimizer) need {_gb(floor)} per GPU of "
                                f"{_gb(usable)} usable, at any micro-batch or recompute"
                            )
                        peak = float(ledger.peak_bytes)
                        if peak > usable:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="memory",
                                    reason=f"over memory by {_gb(peak - usable)}: predicted "
                                    f"peak {_gb(peak)} per GPU of {_gb(usable)} usable "
                                    f"({ledger.peak_phase[0]})"
                                    + _fused_hint(ledger, usable, req.optimizer, ledger_for),
                                    peak_bytes=peak,
                                )
                            )
                            continue
                        key = (mb, m)
                        if key not in wire_cache:
                            stages = sorted({0, pp - 1})
                            wire_cache[key] = {
                                s: traffic(
                                    spec,
                                    topo,
                                    strategy,
                                    micro_batch=mb,
                                    seq_len=req.seq,
                                    dtype=req.dtype,
                                    microbatches=m,
                                    sp=tp > 1,
                                    virtual_stages=vpp,
                                    stage=s,
                                    v_shape=sched == "zbv",
                                )
                                for s in stages
                            }
                        v = _timed(req, cand, peak=peak, wire=wire_cache[key], fpt=fpt)
                        est = v.estimate
                        assert est is not None
                        tps, mfu = v.tokens_per_s_per_gpu, v.mfu
                        frac = est.comm_exposed_s / est.step_s
                        if req.max_exposed_comm is not None and frac > req.max_exposed_comm:
                            rejected.append(
                                Verdict(
                                    cand=cand,
                                    admitted=False,
                                    kind="comm",
                                    reason=f"exposed communication {100 * frac:.1f} % of the step, "
                                    f"over the budget {100 * req.max_exposed_comm:.1f} %",
                                    peak_bytes=peak,
                                    estimate=est,
                                    tokens_per_s_per_gpu=tps,
                                    mfu=mfu,
                                    headroom_bytes=usable - peak,
                                )
                            )
                            continue
                        ranked.append(v)
    if not ranked and not rejected:
        raise UsageError(f"no candidate for {world} GPUs: check --gpus and --global-batch")
    if not ranked and all(v.kind in ("layout", "batch", "unsupported") for v in rejected):
        common = Counter(v.reason for v in rejected).most_common(1)[0][0]
        raise UsageError(
            f"no layout of {world} GPUs fits {spec.name} with global batch {req.global_batch}: "
            f"every candidate breaks a layout or batch rule, most often: {common}"
        )
    ranked.sort(key=lambda v: (-(v.tokens_per_s_per_gpu or 0.0), v.peak_bytes or 0.0, v.cand.name))
    pareto: list[Verdict] = []
    best_mem = float("inf")
    for v in ranked:
        assert v.peak_bytes is not None
        if v.peak_bytes < best_mem:
            pareto.append(v)
            best_mem = v.peak_bytes
    comm_note = (
        "communication: the ledger's wire table timed by parlab.comm's alpha-beta model; "
        f"intra-node {cluster.intra.source}"
        + (
            f" (calibration {cluster.calibration.label} where fitted)"
            if cluster.calibration
            else ""
        )
        + f"; inter-node {cluster.inter.source}"
    )
    tail = [
        f"memory: the ledger's peak ({req.dtype}, {req.optimizer}) against "
        f"{_gb(req.usable_memory)} usable per GPU (catalog {cluster.gpu.name} "
        f"{_gb(cluster.gpu.memory_bytes)} x (1 - reserve {req.memory_reserve:g}))",
        "sequence parallelism on whenever tp > 1; fsdp-hybrid is not searched",
    ]
    roof = req.roofline
    if roof is None:
        notes = [
            f"compute: {fsrc} = {fpt / 1e9:.3g} GFLOP per token; achieved "
            f"{req.throughput.achieved / 1e12:.0f} TFLOP/s per GPU ({req.throughput.source})",
            "recompute: full adds one forward (2N + 4LHQT), selective the attention core's "
            "forward (4LHQT)",
            (
                f"GEMM width: efficiency x f(hidden/tp) / "
                f"f({req.throughput.ref_width or req.spec.hidden:g}), "
                f"f(n) = n / (n + {req.gemm_width_half:g})"
                if req.gemm_width_half
                else "GEMM width: not modelled (the same MFU at every tp)"
            ),
            comm_note,
            f"overlap: non-blocking items hide behind {100 * req.overlap:.0f} % of the backward "
            "pass (2/3 of compute); blocking items are exposed in full",
            "bubble: (compute + blocking comm) x (pp - 1) / (v x micro-batches); zbv: (pp - 1) x "
            "max(B, 2 (B - W)) of one chunk's input- and weight-gradient passes "
            "(parlab.plan.estimate.zbv_bubble)",
            *tail,
        ]
    else:
        impl = req.implementation
        measured_bw = bool(roof.optimizer_bw and roof.cast_bw)
        notes = [
            f"compute (roofline, parlab.plan.roofline): GEMMs 6N per token at {roof.gemm:.3f} of "
            f"the bf16 peak at width {roof.gemm_width:g}, x f(hidden/tp) / f(width), f(n) = "
            f"n / (n + {roof.gemm_width_half:g}); the attention core "
            + (
                f"(causal flash: 6LHQT per token) at {roof.attention:.3f} ({roof.ring_attention:.3f}"
                " as the context-parallel ring)"
                if impl.attention_kernel == "flash"
                else "materialised (12LHQT at GEMM speed, every score through the softmax)"
            )
            + f"; elementwise ops ({impl.norm_kernel}), the loss"
            + ("" if measured_bw else ", casts and the optimizer step")
            + f" as bytes / ({roof.memory:.3f} x {cluster.gpu.memory_bw / 1e12:.2f} TB/s "
            "catalog HBM)"
            + (
                f", the optimizer step at {roof.optimizer_bw / 1e12:.2f} TB/s and the casts at "
                f"{roof.cast_bw / 1e12:.2f} TB/s"
                + (
                    f", DDP's bucket passes at {roof.bucket_bw / 1e12:.2f} TB/s"
                    if roof.bucket_bw
                    else ""
                )
                + " (measured: parlab.plan.paramwork)"
                if measured_bw
                else ""
            )
            + f" -- {roof.source or 'efficiencies as given'}",
            "recompute: full replays the forward (GEMMs, attention, elementwise), selective the "
            "attention core's forward (Megatron's); op-selective (parlab train's --recompute "
            "selective, op-level) the blocks' elementwise forward",
            comm_note,
            f"overlap: each collective hides under its mechanism's window (DDP/ZeRO/FSDP gradient "
            f"collectives under backward, FSDP/ZeRO-3 gathers under their phase, ZeRO-1/2 gathers "
            f"under forward, the CP ring under attention; {100 * req.overlap:.0f} % of each), one "
            f"call exposed; TP, PP and EP transfers exposed in full; compute loses "
            f"{roof.contention:.3f} x the hidden time (contention)",
            "bubble: (per-micro-batch compute + blocking comm) x (pp - 1) / (v x micro-batches); "
            "zbv: (pp - 1) x max(B, 2 (B - W)) of one chunk's input- and weight-gradient passes "
            "(parlab.plan.estimate.zbv_bubble)",
            *tail,
        ]
    return PlanResult(
        request=req,
        ranked=ranked,
        rejected=rejected,
        pareto=pareto,
        flops_source=fsrc,
        flops_per_token=fpt,
        elapsed_s=time.perf_counter() - t0,
        ledger_calls=calls,
        notes=notes,
    )


def _fused_hint(ledger: Any, usable: float, optimizer: str, ledger_for: Any) -> str:
    """Where the foreach optimizer's temporaries are what puts the peak over: the same layout's
    ledger with the fused form of the optimizer (no temporaries, ``ledger_for(optimizer=)``),
    and its peak if that fits."""
    from parlab.ledger.predict import OPTIMIZERS

    temp = float(ledger.value("optimizer_temporaries"))
    fused = f"{optimizer}-fused"
    if not temp or ledger.peak_bytes - temp > usable or fused not in OPTIMIZERS:
        return ""
    again = ledger_for(optimizer=fused)
    if again.peak_bytes > usable:
        return ""
    return (
        f"; the {optimizer} temporaries ({_gb(temp)}) put it over: with --optimizer {fused} "
        f"(what parlab train runs on GPUs) the peak is {_gb(again.peak_bytes)}"
    )


def candidate_work(req: PlanRequest, cand: Candidate, *, sp: bool) -> Any:
    """The roofline's work of one step of ``cand`` for ``req`` (``parlab.plan.roofline.work``)."""
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
    )


def candidate_roofline(req: PlanRequest, cand: Candidate) -> Roofline | None:
    """``req.roofline`` for ``cand``: with ``req.shapes``, its measured GEMM, attention-core
    and recompute factors where they cover the candidate's model, micro-batch x sequence and
    GPU (``parlab.plan.shapes.shaped``); else as fitted."""
    roof = req.roofline
    if roof is None or req.shapes is None:
        return roof
    from parlab.plan.shapes import shaped

    return shaped(_batch(req, cand), roof, req.shapes)


def _batch(req: PlanRequest, cand: Candidate) -> Any:
    """``cand``'s ``parlab.plan.shapes.Batch``."""
    from parlab.plan.shapes import Batch

    return Batch(
        model=req.spec.name,
        micro_batch=cand.micro_batch,
        seq=req.seq,
        tp=cand.tp,
        cp=cand.cp,
        gpu=req.cluster.gpu.name,
        recompute=cand.recompute,
    )


def shapes_note(req: PlanRequest, cand: Candidate) -> str:
    """What ``req.shapes`` changed in ``cand``'s roofline (``candidate_roofline``), in words;
    '' where it changed nothing."""
    roof = req.roofline
    if roof is None or req.shapes is None:
        return ""
    from parlab.plan.shapes import attn_factor, gemm_factor, rc_efficiency

    batch = _batch(req, cand)
    parts = []
    if (g := gemm_factor(batch, roof, req.shapes)) is not None:
        parts.append(f"GEMMs x {g[0]:.3f} against {g[1]}'s (instead of the width law)")
    if (a := attn_factor(batch, roof, req.shapes)) is not None:
        parts.append(f"attention core x {a[0]:.3f} against {a[1]}'s")
    if (k := rc_efficiency(batch, req.shapes)) is not None:
        parts.append(f"the full recompute's GEMMs at {k:.3f} of peak")
    if not parts:
        return ""
    return (
        f"shapes: the GEMM-shape probe measured {req.spec.name} at {batch.micro_batch} x "
        f"{batch.seq} on {req.cluster.gpu.name}: {'; '.join(parts)} ({req.shapes.label})"
    )


def _timed(
    req: PlanRequest,
    cand: Candidate,
    *,
    peak: float,
    wire: dict[int, list[Any]],
    fpt: float,
    sp: bool | None = None,
) -> Verdict:
    """An admitted verdict: the step-time estimate and what follows from it."""
    world = req.cluster.count
    th = req.throughput
    ref = th.ref_width or float(req.spec.hidden)
    eff = width_factor(req.spec.hidden / cand.tp, ref, req.gemm_width_half)
    roof = candidate_roofline(req, cand)
    if roof is None:
        extra = recompute_flops_per_token(req.spec, req.seq, cand.recompute)
        compute_s = (fpt + extra) * req.tokens_per_step / world / (th.achieved * eff)
        est = estimate(
            cand, wire=wire, cluster=req.cluster, compute_s=compute_s, overlap=req.overlap
        )
    else:
        w = candidate_work(req, cand, sp=cand.tp > 1 if sp is None else sp)
        parts = w.parts(roof, th.peak_flops, float(req.cluster.gpu.memory_bw))
        est = estimate(
            cand,
            wire=wire,
            cluster=req.cluster,
            compute_s=parts.total_s,
            overlap=req.overlap,
            parts=parts,
            contention=roof.contention,
        )
    tps = req.tokens_per_step / est.step_s / world
    return Verdict(
        cand=cand,
        admitted=True,
        peak_bytes=peak,
        estimate=est,
        tokens_per_s_per_gpu=tps,
        mfu=fpt * tps / req.throughput.peak_flops,
        headroom_bytes=req.usable_memory - peak,
    )


def evaluate(req: PlanRequest, cand: Candidate, *, sp: bool | None = None) -> Verdict:
    """One given candidate through the same checks and estimate as ``plan`` (no search).

    ``sp`` overrides sequence parallelism (default: on when tp > 1).
    """
    spec, cluster = req.spec, req.cluster
    sp = cand.tp > 1 if sp is None else sp
    deg = {"pp": cand.pp, "dp": cand.dp, "cp": cand.cp, "tp": cand.tp, "ep": cand.ep}
    rows = constraints(
        world=cluster.count,
        degrees=deg,
        shape=shape_of(spec),
        seq=req.seq,
        sequence_parallel=sp,
        gpus_per_node=cluster.gpus_per_node,
        vpp=cand.vpp,
    )
    bad = [r for r in rows if not r.ok]
    if bad:
        reason = "; ".join(f"{r.name} fails ({r.detail})" for r in bad)
        return Verdict(cand=cand, admitted=False, kind="layout", reason=reason)
    topo = Topology(world_size=cluster.count, **deg)
    sched = "1f1b" if cand.schedule == "-" else cand.schedule
    ledger = predict(
        spec,
        strategy=cand.strategy,
        topology=topo,
        micro_batch=cand.micro_batch,
        seq_len=req.seq,
        dtype=req.dtype,
        optimizer=req.optimizer,
        recompute=cand.recompute,
        pp_schedule=sched,
        microbatches=cand.microbatches,
        virtual_stages=cand.vpp,
        sp=sp,
    )
    wire = {
        st: traffic(
            spec,
            topo,
            cand.strategy,
            micro_batch=cand.micro_batch,
            seq_len=req.seq,
            dtype=req.dtype,
            microbatches=cand.microbatches,
            sp=sp,
            virtual_stages=cand.vpp,
            stage=st,
            v_shape=cand.schedule == "zbv",
        )
        for st in sorted({0, cand.pp - 1})
    }
    fpt, _ = flops_per_token(spec, req.seq)
    v = _timed(req, cand, peak=float(ledger.peak_bytes), wire=wire, fpt=fpt, sp=sp)
    if ledger.peak_bytes > req.usable_memory:
        return Verdict(
            cand=cand,
            admitted=False,
            kind="memory",
            reason=f"over memory by {_gb(ledger.peak_bytes - req.usable_memory)}",
            peak_bytes=v.peak_bytes,
            estimate=v.estimate,
            tokens_per_s_per_gpu=v.tokens_per_s_per_gpu,
            mfu=v.mfu,
            headroom_bytes=v.headroom_bytes,
        )
    return v
