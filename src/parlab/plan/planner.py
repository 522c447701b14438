"""``parlab plan``: admit or reject every candidate with a reason, predict, rank, Pareto front.

Admission, in order (the first failing check is the reason, with its ``kind``):

1. ``layout`` -- a row of the layout's constraint table fails (``parlab.layout.constraints``:
   heads/KV heads/FFN/vocab divisible by tp, a layer for each of the pp x v chunks, sequence by
   2 cp, ep dividing dp, tp within a node);
2. ``batch`` -- the global batch is not a whole number of micro-batches of ``micro_batch``
   sequences on each of the dp ranks, or interleaving has a micro-batch count that is not a
   multiple of pp (Megatron's rule), or the zero-bubble V has fewer than 2p - 1 micro-batches;
3. ``unsupported`` -- the ledger refuses the layout (its own message);
4. ``memory`` -- the ledger's predicted peak of the fullest stage (``parlab.ledger.predict``:
   the first stage holds p micro-batches in flight under 1F1B) exceeds the usable memory. The
   states alone (params, grads, optimizer, master) are a floor of every peak, so a (layout,
   strategy) whose floor is over is rejected for every micro-batch, recompute and schedule at
   once, "by at least" the floor's excess;
5. ``comm`` -- exposed communication over ``max_exposed_comm`` of the step.

Each admitted candidate gets a predicted step time (``parlab.plan.estimate``; compute priced by
the request's ``compute``: the built-in model of ``parlab.plan.compute``, one fitted on a
results folder, or one MFU), tokens/s per GPU, MFU and memory headroom. The ranking is by
tokens/s per GPU (ties: less memory, then name); the Pareto front is every admitted candidate
that no other beats on both throughput and peak memory.

The search space is ``parlab.plan.space``'s, less what cannot pay: context parallelism only
where each rank keeps at least ``CP_MIN_TOKENS`` tokens of a sequence. Under pipeline
parallelism FSDP keeps its parameters gathered across the micro-batches of a step
(torch's pipelining does not reshard after forward) and reduce-scatters once a step.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from parlab.errors import UsageError
from parlab.layout import constraints, shape_of
from parlab.ledger import Implementation, models_compiled, predict
from parlab.ledger.sharding import chunk_sizes
from parlab.ledger.traffic import traffic
from parlab.models.spec import ModelSpec
from parlab.plan.compute import ComputeModel, StepShape
from parlab.plan.estimate import (
    StageWork,
    StepEstimate,
    Throughput,
    estimate,
    flops_per_token,
    mfu_parts,
)
from parlab.plan.roofline import PRODUCTION, Work, work
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

CP_MIN_TOKENS = 8192
"""Context parallelism is searched only where each rank keeps at least this many tokens of a
sequence, as Llama 3 ran it (CP 16 only for its 131,072-token stage: 8,192 tokens a rank; its
8,192-token stages without CP): below it the ring's blocks are small for their K/V exchange to
hide under their attention, and a sequence that short does not need its activations split. A
``--layout`` with a smaller share is still evaluated."""


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
    compute: ComputeModel | Throughput
    """How compute time is priced: a compute model (efficiencies per step shape) or one MFU."""
    micro_batches: tuple[int, ...] = DEFAULT_MICRO_BATCHES
    """Micro-batch sizes to try."""
    strategies: tuple[str, ...] = STRATEGIES
    """Data-parallel strategies to try."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Recompute modes to try."""
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    """Pipeline schedules to try (when pp > 1)."""
    dtype: str = "bf16-params"
    """The ledger's dtype policy (default: bf16 parameters and gradients, float32 master weights
    and optimizer states, as Megatron's distributed optimizer and Llama 3 keep them)."""
    optimizer: str = "adamw-fused"
    """The ledger's optimizer (default: fused AdamW, no temporaries)."""
    overlap: float = 1.0
    """Fraction of each window's compute that non-blocking communication can hide behind."""
    memory_reserve: float = 0.0
    """Fraction of GPU memory kept free (CUDA context, fragmentation)."""
    max_exposed_comm: float | None = None
    """Reject candidates whose exposed communication exceeds this fraction of the step."""
    implementation: Implementation = PRODUCTION
    """The kernels the memory, the elementwise bytes and the attention core are counted for
    (default: production's, ``parlab.plan.roofline.PRODUCTION``)."""
    cp_min_tokens: int = CP_MIN_TOKENS
    """The search's context-parallel rule (``CP_MIN_TOKENS``)."""

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

    @property
    def peak_flops(self) -> float:
        return float(self.cluster.gpu.peak("bf16") or 0.0)


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
    """The step-time estimate (admitted, or rejected for memory or comm)."""
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
    return f"{x / 2**30:.2f} GiB"


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


@dataclass(kw_only=True)
class _Group:
    """What candidates of one (layout, strategy) share: the layout rows, the states' floor, the
    stages' work and wire tables."""

    bad: str = ""
    topo: Topology | None = None
    floor: float | None = None
    floor_reason: str = ""
    stages: dict[tuple[int, int, str], list[StageWork]] = field(default_factory=dict)
    wires: dict[tuple[int, int, int], list[Any]] = field(default_factory=dict)
    calls: int = 0


def _layout_group(req: PlanRequest, deg: dict[str, int], vpp: int, sp: bool) -> _Group:
    rows = constraints(
        world=req.cluster.count,
        degrees=deg,
        shape=shape_of(req.spec),
        seq=req.seq,
        sequence_parallel=sp,
        gpus_per_node=req.cluster.gpus_per_node,
        vpp=vpp,
    )
    bad = "; ".join(f"{r.name} fails ({r.detail})" for r in rows if not r.ok)
    return _Group(bad=bad, topo=None if bad else Topology(world_size=req.cluster.count, **deg))


def _reshards(cand: Candidate) -> bool:
    """FSDP under pipeline parallelism keeps its parameters gathered across micro-batches."""
    return not (cand.strategy == "fsdp" and cand.pp > 1)


def _batch_reason(req: PlanRequest, cand: Candidate) -> str:
    per_step = cand.dp * cand.micro_batch
    m = cand.microbatches
    if req.global_batch != per_step * m:
        return (
            f"global batch {req.global_batch} is not a multiple of dp {cand.dp} x micro-batch "
            f"{cand.micro_batch} = {per_step}"
        )
    if cand.schedule == "interleaved" and m % cand.pp:
        return f"interleaved schedule needs the {m} micro-batches to be a multiple of pp {cand.pp}"
    if cand.schedule == "zbv" and m < 2 * cand.pp - 1:
        return f"zero-bubble V needs at least 2 pp - 1 = {2 * cand.pp - 1} micro-batches, not {m}"
    return ""


def judge(
    req: PlanRequest, cand: Candidate, group: _Group, *, sp: bool, time_rejected: bool = False
) -> Verdict:
    """One candidate through every admission check and, where it is admitted (or
    ``time_rejected``: rejected for memory too), the estimate."""
    no = dict(cand=cand, admitted=False)
    if group.bad:
        return Verdict(**no, kind="layout", reason=group.bad)
    if why := _batch_reason(req, cand):
        return Verdict(**no, kind="batch", reason=why)
    usable = req.usable_memory
    if group.floor is not None and group.floor > usable:
        return Verdict(**no, kind="memory", reason=group.floor_reason, peak_bytes=group.floor)
    assert group.topo is not None
    ledger_for = _ledger_for(req, cand, group.topo, sp)
    try:
        group.calls += 1
        ledger = ledger_for(req.optimizer)
    except ValueError as exc:
        return Verdict(**no, kind="unsupported", reason=str(exc))
    if group.floor is None:
        group.floor = _stage_floor(ledger)
        group.floor_reason = (
            f"over memory by at least {_gb(group.floor - usable)}: the states alone (params, "
            f"grads, optimizer) need {_gb(group.floor)} per GPU of {_gb(usable)} usable, at any "
            "micro-batch or recompute"
        )
    peak = float(ledger.peak_bytes)
    if peak > usable and not time_rejected:
        v = Verdict(cand=cand, admitted=True, peak_bytes=peak)
    else:
        v = _timed(req, cand, group, peak=peak, sp=sp)
    if peak > usable:
        stage = max(range(len(ledger.peak_per_stage)), key=lambda s: ledger.peak_per_stage[s])
        reason = (
            f"over memory by {_gb(peak - usable)}: predicted peak {_gb(peak)} per GPU of "
            f"{_gb(usable)} usable (stage {stage}, {ledger.peak_phase[stage]})"
            + _fused_hint(ledger, usable, req.optimizer, ledger_for)
        )
        return _rejected(v, "memory", reason)
    est = v.estimate
    assert est is not None
    frac = est.comm_exposed_s / est.step_s
    if req.max_exposed_comm is not None and frac > req.max_exposed_comm:
        reason = (
            f"exposed communication {100 * frac:.1f} % of the step, over the budget "
            f"{100 * req.max_exposed_comm:.1f} %"
        )
        return _rejected(v, "comm", reason)
    return v


def _rejected(v: Verdict, kind: str, reason: str) -> Verdict:
    return Verdict(
        cand=v.cand, admitted=False, kind=kind, reason=reason, peak_bytes=v.peak_bytes,
        estimate=v.estimate, tokens_per_s_per_gpu=v.tokens_per_s_per_gpu, mfu=v.mfu,
        headroom_bytes=v.headroom_bytes,
    )  # fmt: skip


def _ledger_for(req: PlanRequest, cand: Candidate, topo: Topology, sp: bool) -> Any:
    impl = req.implementation
    norm = impl.norm_kernel
    if norm == "compiled" and not models_compiled(
        req.spec, dtype=req.dtype, strategy=cand.strategy, recompute=cand.recompute
    ):
        norm = "fused"

    def call(optimizer: str) -> Any:
        return predict(
            req.spec,
            strategy=cand.strategy,
            topology=topo,
            micro_batch=cand.micro_batch,
            seq_len=req.seq,
            dtype=req.dtype,
            optimizer=optimizer,
            recompute=cand.recompute,
            pp_schedule="1f1b" if cand.schedule == "-" else cand.schedule,
            microbatches=cand.microbatches,
            virtual_stages=cand.vpp,
            sp=sp,
            reshard_after_forward=_reshards(cand),
            impl=Implementation(
                norm_kernel=norm, kv_repeat=impl.kv_repeat, attention_kernel=impl.attention_kernel
            ),
        )

    return call


def plan(req: PlanRequest) -> PlanResult:
    """Search the whole candidate space of ``req`` (see the module docstring)."""
    t0 = time.perf_counter()
    spec = req.spec
    world = req.cluster.count
    ranked: list[Verdict] = []
    rejected: list[Verdict] = []
    calls = 0
    moe = spec.moe.num_experts if spec.moe is not None else None
    modes = searched_recompute(req)
    for deg in degree_tuples(world, moe_experts=moe):
        pp, dp, cp, tp, ep = deg["pp"], deg["dp"], deg["cp"], deg["tp"], deg["ep"]
        if cp > 1 and req.seq // cp < req.cp_min_tokens:
            continue
        for sched, vpp in schedules_for(pp, spec.layers):
            if sched != "-" and sched not in req.schedules:
                continue
            base = _layout_group(req, deg, vpp, tp > 1)
            for strategy in req.strategies:
                group = _Group(bad=base.bad, topo=base.topo)
                over: Verdict | None = None  # the least-memory candidate found over memory
                for mb in sorted(req.micro_batches):
                    m = max(1, req.global_batch // (dp * mb))
                    for rc in sorted(modes, key=MEMORY_ORDER.index):
                        cand = Candidate(
                            dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, strategy=strategy,
                            micro_batch=mb, microbatches=m, recompute=rc, schedule=sched,
                            vpp=vpp,
                        )  # fmt: skip
                        v = _over(cand, over) or judge(req, cand, group, sp=tp > 1)
                        if v.kind == "memory" and over is None and v.peak_bytes:
                            over = v
                        (ranked if v.admitted else rejected).append(v)
                calls += group.calls
    if not ranked and not rejected:
        raise UsageError(f"no candidate for {world} GPUs: check --gpus and --global-batch")
    if not ranked and all(v.kind in ("layout", "batch", "unsupported") for v in rejected):
        common = Counter(v.reason for v in rejected).most_common(1)[0][0]
        raise UsageError(
            f"no layout of {world} GPUs fits {spec.name} with global batch {req.global_batch}: "
            f"every candidate breaks a layout or batch rule, most often: {common}"
        )
    ranked.sort(key=lambda v: (-(v.tokens_per_s_per_gpu or 0.0), v.peak_bytes or 0.0, v.cand.name))
    fpt, fsrc = flops_per_token(spec, req.seq)
    return PlanResult(
        request=req,
        ranked=ranked,
        rejected=rejected,
        pareto=pareto_front(ranked),
        flops_source=fsrc,
        flops_per_token=fpt,
        elapsed_s=time.perf_counter() - t0,
        ledger_calls=calls,
        notes=plan_notes(req, ranked[0] if ranked else None),
    )


def searched_recompute(req: PlanRequest) -> tuple[str, ...]:
    """The recompute modes searched: Megatron's selective recompute drops the attention core's
    scores, which flash attention never keeps, so with flash it keeps no less than ``none`` at
    more compute and is left out (unless it is all that was asked)."""
    if req.implementation.attention_kernel == "flash" and len(req.recompute) > 1:
        return tuple(r for r in req.recompute if r != "selective")
    return req.recompute


MEMORY_ORDER = ("full", "selective", "op-selective", "none")
"""Recompute modes from the least activation memory kept to the most."""


def _over(cand: Candidate, over: Verdict | None) -> Verdict | None:
    """Rejected without asking the ledger where a candidate of the same layout and strategy
    with no larger micro-batch and no less recompute is already over memory: its peak is at
    least that one's (activations grow with the micro-batch and shrink with recompute)."""
    if over is None:
        return None
    o = over.cand
    heavier = cand.micro_batch >= o.micro_batch and MEMORY_ORDER.index(
        cand.recompute
    ) >= MEMORY_ORDER.index(o.recompute)
    if not heavier or cand.microbatches > o.microbatches:
        return None
    return Verdict(
        cand=cand, admitted=False, kind="memory", peak_bytes=over.peak_bytes,
        reason=f"over memory: its peak is at least {o.name}'s ({_gb(over.peak_bytes or 0)})",
    )  # fmt: skip


def pareto_front(ranked: list[Verdict]) -> list[Verdict]:
    """The admitted candidates no other beats on both throughput and peak memory."""
    front: list[Verdict] = []
    best_mem = float("inf")
    for v in ranked:
        assert v.peak_bytes is not None
        if v.peak_bytes < best_mem:
            front.append(v)
            best_mem = v.peak_bytes
    return front


def plan_notes(req: PlanRequest, top: Verdict | None) -> list[str]:
    """The assumptions a reader of the plan needs, one line each."""
    c = req.cluster
    if isinstance(req.compute, Throughput):
        compute = (
            f"compute: every FLOP (6N + 12LHQT per token, PaLM's count; recompute's too) at "
            f"{req.compute.achieved / 1e12:.0f} TFLOP/s per GPU ({req.compute.source})"
        )
    elif top is not None:
        compute = req.compute.describe(step_shape(req, top.cand))
    else:
        compute = "compute: built-in model (no candidate admitted)"
    return [
        compute,
        "recompute: full replays the blocks' forward; selective (Megatron's) the attention "
        "core's forward",
        f"network: {c.describe_links()}",
        f"overlap: each collective hides under its mechanism's window ({100 * req.overlap:.0f} % "
        "of it; DDP's and ZeRO-1's gradient collectives under the last micro-batch's backward), "
        "one call exposed; TP, PP and EP transfers exposed in full (no TP comm overlap assumed)",
        "bubble: (sum of the stages' per-step work - the slowest's) / (v x micro-batches), the "
        "slowest stage pacing the step (parlab.plan.estimate.pipeline_bubble)",
        f"memory: the ledger's peak of the fullest stage ({req.dtype}, {req.optimizer}) against "
        f"{_gb(req.usable_memory)} usable per GPU (catalog {c.gpu.name} "
        f"{_gb(c.gpu.memory_bytes)} x (1 - reserve {req.memory_reserve:g}))",
        f"searched: sequence parallelism whenever tp > 1; cp only where a rank keeps >= "
        f"{req.cp_min_tokens} tokens; interleaving up to one layer per chunk; FSDP under PP "
        "without resharding between micro-batches"
        + (
            "; selective recompute left out (flash attention keeps no scores for it to drop)"
            if searched_recompute(req) != req.recompute
            else ""
        ),
    ]


def _fused_hint(ledger: Any, usable: float, optimizer: str, ledger_for: Any) -> str:
    """Where the foreach optimizer's temporaries are what puts the peak over: the same layout's
    ledger with the fused form of the optimizer, and its peak if that fits."""
    from parlab.ledger import OPTIMIZERS

    temp = float(ledger.value("optimizer_temporaries"))
    fused = f"{optimizer}-fused"
    if not temp or ledger.peak_bytes - temp > usable or fused not in OPTIMIZERS:
        return ""
    again = ledger_for(fused)
    if again.peak_bytes > usable:
        return ""
    return (
        f"; the {optimizer} temporaries ({_gb(temp)}) put it over: with --optimizer {fused} "
        f"(what parlab train runs on GPUs) the peak is {_gb(again.peak_bytes)}"
    )


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


def _stages(req: PlanRequest, cand: Candidate, group: _Group, sp: bool) -> list[StageWork]:
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
                reshard_after_forward=_reshards(cand),
            )  # fmt: skip
        wire = group.wires[wkey]
        out.append(StageWork(stage=stage, count=count, parts=parts, wire=wire))
    group.stages[key] = out
    return out


def _timed(req: PlanRequest, cand: Candidate, group: _Group, *, peak: float, sp: bool) -> Verdict:
    """An admitted verdict: the step-time estimate and what follows from it."""
    contention = 0.0
    if not isinstance(req.compute, Throughput):
        contention = req.compute.roofline(step_shape(req, cand)).contention
    est = estimate(
        cand,
        stages=_stages(req, cand, group, sp),
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


def evaluate(req: PlanRequest, cand: Candidate, *, sp: bool | None = None) -> Verdict:
    """One given candidate through the same checks and estimate as ``plan`` (no search).

    ``sp`` overrides sequence parallelism (default: on when tp > 1).
    """
    sp = cand.tp > 1 if sp is None else sp
    deg = {"pp": cand.pp, "dp": cand.dp, "cp": cand.cp, "tp": cand.tp, "ep": cand.ep}
    return judge(req, cand, _layout_group(req, deg, cand.vpp, sp), sp=sp, time_rejected=True)
