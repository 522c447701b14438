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

The request, verdicts and result are ``parlab.plan.request``'s; one candidate's checks
``parlab.plan.admission``'s; its timing ``parlab.plan.pricing``'s. This module searches.
"""

from __future__ import annotations

import time
from collections import Counter

from parlab.errors import UsageError
from parlab.plan.admission import gib, judge, layout_group
from parlab.plan.pricing import Group, step_shape
from parlab.plan.request import PlanRequest, PlanResult, Verdict
from parlab.plan.space import Candidate, degree_tuples, schedules_for
from parlab.plan.throughput import Throughput, flops_per_token


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
            base = layout_group(req, deg, vpp, tp > 1)
            for strategy in req.strategies:
                group = Group(bad=base.bad, topo=base.topo)
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
    fpt, _ = flops_per_token(spec, req.seq)
    return PlanResult(
        request=req,
        ranked=ranked,
        rejected=rejected,
        pareto=pareto_front(ranked),
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
        reason=f"over memory: its peak is at least {o.name}'s ({gib(over.peak_bytes or 0)})",
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
        f"{gib(req.usable_memory)} usable per GPU (catalog {c.gpu.name} "
        f"{gib(c.gpu.memory_bytes)} x (1 - reserve {req.memory_reserve:g}))",
        f"searched: sequence parallelism whenever tp > 1; cp only where a rank keeps >= "
        f"{req.cp_min_tokens} tokens; interleaving up to one layer per chunk; FSDP under PP "
        "without resharding between micro-batches"
        + (
            "; selective recompute left out (flash attention keeps no scores for it to drop)"
            if searched_recompute(req) != req.recompute
            else ""
        ),
    ]
