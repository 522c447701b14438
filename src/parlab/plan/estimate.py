"""Predicted step time of one candidate: per pipeline stage, compute + exposed communication;
the slowest stage sets the pace, and the pipeline bubble is added.

**Compute** per stage (``parlab.plan.roofline.ComputeParts``): GEMMs, the attention core and the
memory-bound work, each at its efficiency (the built-in model of ``parlab.plan.compute``, or one
fitted on a results folder), or with ``--mfu`` every FLOP (PaLM's count, ``6 N + 12 L H Q T``
per token) at one MFU (``parlab.plan.throughput``).

**Communication**: every item of the ledger's wire table (``parlab.ledger.traffic.traffic``,
the one definition of what crosses the wire) is priced by the links its group crosses
(``item_time``): a group inside the NVLink domain (one node) on the node's link, as a flat ring;
a group spanning nodes hierarchically (``parlab.comm.model.hierarchical_time``: inside each
node on NVLink, between nodes on the rail of each GPU's own NIC), its all-reduce the faster of
ring and tree as NCCL chooses between them. Ranks are ordered pp, dp, cp, tp (tp innermost),
so a group's members per node follow from its stride.

**Overlap**: each item hides under its mechanism's window (``OVERLAP_WINDOW``): DDP's bucketed
all-reduce and ZeRO-1's reduce-scatter under the backward of the last micro-batch (they run once
a step, after the gradients have accumulated), ZeRO-2/FSDP reduce-scatters under the backward,
FSDP/ZeRO-3 gathers under their phase (prefetch), ZeRO-1/2's post-step gathers under the next
forward, the context-parallel ring under the attention core; ``overlap`` of each window's
compute, shared by its items, minus one call of each chain (nothing to hide the first or last
under). Tensor-, pipeline- and expert-parallel transfers are on the critical path, exposed in
full. Compute loses ``contention`` x the hidden time.

**Bubble** (``pipeline_bubble``): a pipeline of stages with per-step work ``T_k`` (compute of
its micro-batches and blocking communication, not the once-a-step optimizer) runs
``max T + (sum T - max T) / (v m)``: the slowest stage paces the steady state, and the others'
fill and drain cost one micro-batch each, a ``v``-th of it with ``v`` interleaved chunks; equal
stages give the textbook ``(p - 1) / (v m)`` of compute. The zero-bubble V (``zbv``) splits the
backward into input- and weight-gradient passes and has its own (``zbv_bubble``).

Nothing here crosses a wire: it predicts what will.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.comm.model import collective_time, hierarchical_time
from parlab.ledger.activations import bubble_fraction
from parlab.plan.roofline import ComputeParts
from parlab.plan.space import Candidate, Cluster

# the ledger's collective names -> parlab.comm's op names
_OPS = {
    "all-reduce": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "send-recv": "send_recv",
    "broadcast": "broadcast",
}


def zbv_passes(parts: ComputeParts | None) -> tuple[float, float, float]:
    """Shares (forward, input gradient, weight gradient) of the per-micro-batch compute.

    The weight gradients are the GEMMs' ``2 N`` FLOPs per token of their ``(6 + 2 rc) N``
    (``rc`` = 1 under full recompute); the forward is its plain pass, the same share of every
    kind of work (the roofline's ``forward_fraction`` is ``(2 + 2 rc) / (6 + 2 rc)``, its plain
    part ``(1 - forward_fraction) / 2``); the input-gradient pass is the rest: the GEMMs'
    input gradients, the attention core's and the elementwise backward, and any recompute
    (torch's input-gradient pass replays a checkpointed forward). Without ``parts`` (the MFU
    model) all of it is GEMMs: a third each.
    """
    if parts is None or parts.per_token_s <= 0:
        return 1 / 3, 1 / 3, 1 / 3
    fwd = (1.0 - parts.forward_fraction) / 2.0
    w = parts.gemm_s / parts.per_token_s * fwd
    return fwd, 1.0 - fwd - w, w


def zbv_bubble(pp: int, microbatches: int, t_b: float, t_w: float) -> float:
    """Idle seconds per step of torch's zero-bubble V (``ScheduleZBVZeroBubble``) on ``pp`` ranks.

    ``t_b``, ``t_w``: one micro-batch's input- and weight-gradient pass through one chunk (half a
    rank's layers). The bubble is ``(pp - 1) x max(t_b, 2 (t_b - t_w))``, whatever the
    micro-batch count.

    Where it comes from: the V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
    Section 6: 2p chunks, rank k holding chunks k and 2p - 1 - k, the backward split into B and
    W, the W passes deferred into the gaps) as torch 2.x orders it per rank (warm-up
    ``2(p - k) - 1`` forwards of chunk k, then ``k`` pairs, then ``p - k`` F-I-W of chunk
    2p - 1 - k, the steady F I W of each chunk, a cool-down of I passes and the deferred W
    passes). Replaying those action lists with fixed pass times ``t_f``, ``t_b``, ``t_w`` (a
    forward needs the previous chunk's forward, an input gradient the next chunk's, or the
    chunk's own forward on the last chunk, a weight gradient its own input gradient; transfers
    free) gives exactly this bubble whenever ``t_f <= t_b``, ``t_w <= t_b`` and
    ``m >= 2 pp - 1`` (``tests/test_plan_zbv.py`` replays them); outside that region the replay
    idles longer and this is a lower bound. The paper's zero bubble at ``T_F = T_B = T_W`` is
    its steady state over iterations (the parallelogram, with its optimizer post-validation);
    one step of torch's lists, timed alone, starts its last rank (p - 1) chunk-forwards late and
    ends with the input-gradient chain of the last micro-batches: ``(p - 1) t_b`` at equal
    times, a sixth of 1F1B's ``(p - 1)(T_F + T_B + T_W)`` (whole-stage times, twice a chunk's).
    Assumed: equal chunks, fixed pass times, and no transfer time in the chain (the estimate
    times the transfers as blocking communication and scales the passes by them, as for 1F1B).
    """
    if pp < 2:
        return 0.0
    return (pp - 1) * max(t_b, 2.0 * (t_b - t_w))


def _span(cand: Candidate, axis: str, gpus_per_node: int) -> tuple[int, int]:
    """(members per node, nodes) of one group of ``axis`` in rank order pp, dp, cp, tp."""
    stride = {
        "tp": 1,
        "cp": cand.tp,
        "ep": cand.tp * cand.cp,
        "dp": cand.tp * cand.cp,
        "edp": cand.tp * cand.cp * cand.ep,
        "pp": cand.tp * cand.cp * cand.dp,
    }.get(axis, cand.tp * cand.cp)
    size = {
        "tp": cand.tp,
        "cp": cand.cp,
        "ep": cand.ep,
        "dp": cand.dp,
        "edp": cand.dp // cand.ep,
        "pp": cand.pp,
    }.get(axis, cand.dp)
    if stride * size <= gpus_per_node:
        return size, 1
    per_node = max(1, gpus_per_node // stride)
    return per_node, max(1, size // per_node)


def item_time(item: Any, cand: Candidate, cluster: Cluster) -> float:
    """Seconds for ALL calls of one wire item in a step (see the module docstring)."""
    op = _OPS[item.collective]
    per_node, nodes = _span(cand, item.axis, cluster.gpus_per_node)
    intra = cluster.intra_link(op)
    if nodes == 1:
        one = collective_time(op, item.payload_bytes, item.group_size, intra)
    elif op == "send_recv":
        one = collective_time(op, item.payload_bytes, 2, cluster.inter)
    else:
        one = hierarchical_time(
            op,
            item.payload_bytes,
            gpus_per_node=per_node,
            nodes=nodes,
            intra=intra,
            inter=cluster.inter,
        )
    return one * item.count_per_step


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    """The parts of one predicted step (the slowest pipeline stage's, and the bubble)."""

    compute_s: float
    """Compute time per GPU (recompute included; slowed by contention)."""
    comm_blocking_s: float
    """Blocking communication (exposed in full)."""
    comm_overlappable_s: float
    """Non-blocking communication before overlap."""
    comm_exposed_s: float
    """Communication on the critical path (blocking + what its window could not hide)."""
    bubble_s: float
    """Pipeline bubble."""
    step_s: float
    """compute + exposed comm + bubble."""
    top_items: tuple[tuple[str, float], ...]
    """The largest communication items: (description, seconds per step)."""
    comm_hidden_s: float = 0.0
    """Communication hidden under compute (its contention is in compute_s)."""
    stage: int = 0
    """The pipeline stage that sets the pace."""

    def to_json(self) -> dict[str, Any]:
        return {
            "compute_s": self.compute_s,
            "comm_blocking_s": self.comm_blocking_s,
            "comm_overlappable_s": self.comm_overlappable_s,
            "comm_exposed_s": self.comm_exposed_s,
            "bubble_s": self.bubble_s,
            "step_s": self.step_s,
            "top_comm_items": [{"item": d, "seconds": s} for d, s in self.top_items],
            "comm_hidden_s": self.comm_hidden_s,
            "slowest_stage": self.stage,
        }


# Which compute window each mechanism's collectives hide under (``parlab.parallel``): DDP's
# bucketed all-reduces and ZeRO-1's reduce-scatter run once a step, as the last micro-batch's
# backward makes the gradients; ZeRO-2/FSDP reduce-scatter each micro-batch's during backward;
# FSDP and ZeRO-3 prefetch the next unit's all-gather during the current unit's forward or
# backward; ZeRO-1/2 issue every all-gather after the step and each unit's forward waits for its
# own; the context-parallel ring shifts K/V during the current block's attention. Tensor- and
# pipeline-parallel transfers (and expert all-to-alls) sit on the critical path.
OVERLAP_WINDOW: dict[tuple[str, str], str] = {
    ("ddp", "all-reduce"): "last-backward",
    ("zero1", "reduce-scatter"): "last-backward",
    ("zero2", "reduce-scatter"): "backward",
    ("zero3", "reduce-scatter"): "backward",
    ("fsdp", "reduce-scatter"): "backward",
    ("zero1", "all-gather"): "forward",
    ("zero2", "all-gather"): "forward",
    ("zero3", "all-gather"): "phase",
    ("fsdp", "all-gather"): "phase",
    ("cp", "send-recv"): "attention",
}


def overlap_window(item: Any) -> str | None:
    """The compute window ``item`` hides under (``forward``, ``backward``, ``last-backward``,
    ``attention``), or None when it is exposed in full; mechanisms not in ``OVERLAP_WINDOW``
    follow the ledger's ``blocking`` flag (non-blocking items hide under backward)."""
    w = OVERLAP_WINDOW.get((item.source, item.collective))
    if w == "phase":
        return "forward" if item.phase == "forward" else "backward"
    if w is not None:
        return w
    return None if item.blocking else "backward"


def exposed_time(total_s: float, one_call_s: float, window_s: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of a collective of ``total_s`` hidden under ``window_s`` of
    compute: the first or last call of a chain has nothing to hide under, the rest hides up to
    the window. Both are in [0, total_s] and sum to it."""
    total_s = max(0.0, total_s)
    tail = min(total_s, max(0.0, one_call_s))
    hidden = min(total_s - tail, max(0.0, window_s))
    return total_s - hidden, hidden


@dataclass(frozen=True, kw_only=True)
class StageWork:
    """One pipeline stage's work: its compute and its wire table."""

    stage: int
    """The stage index (a representative of ``count`` stages alike)."""
    count: int
    """How many of the pp stages share this work."""
    parts: ComputeParts
    """Its compute seconds by kind."""
    wire: list[Any]
    """Its wire items (``parlab.ledger.traffic``)."""


@dataclass(frozen=True, kw_only=True)
class _StageTime:
    compute: float
    blocking: float
    nonblocking: float
    exposed: float
    hidden: float
    piped: float
    timed: list[tuple[str, float]]


def _stage_time(
    sw: StageWork, cand: Candidate, cluster: Cluster, overlap: float, contention: float
) -> _StageTime:
    parts = sw.parts
    m = max(1, cand.microbatches)
    windows = {
        "forward": overlap * parts.forward_s,
        "backward": overlap * parts.backward_s,
        "last-backward": overlap * parts.backward_s / m,
        "attention": overlap * parts.attention_s,
    }
    blocking = nonblocking = exposed = hidden = 0.0
    timed = []
    for it in sw.wire:
        t = item_time(it, cand, cluster)
        timed.append(
            (f"{it.collective}@{it.axis} x{it.count_per_step} ({it.source}, {it.phase})", t)
        )
        w = overlap_window(it)
        if w is None:
            blocking += t
            exposed += t
            continue
        nonblocking += t
        e, h = exposed_time(t, t / max(1, it.count_per_step), windows[w])
        windows[w] -= h
        exposed += e
        hidden += h
    comp = parts.total_s + contention * hidden
    # what the bubble idles: the per-micro-batch work, not the once-a-step optimizer
    piped = comp - parts.step_s + blocking
    return _StageTime(
        compute=comp, blocking=blocking, nonblocking=nonblocking, exposed=exposed,
        hidden=hidden, piped=piped, timed=timed,
    )  # fmt: skip


def pipeline_bubble(piped: list[tuple[float, int]], microbatches: int, vpp: int) -> float:
    """Idle seconds a pipeline adds to its slowest stage: ``(sum T - max T) / (v m)`` over the
    stages' per-step work ``T`` (``(T, how many stages)`` pairs): the bubble fraction
    (``parlab.ledger.activations.bubble_fraction``) of the other stages' mean work, so
    ``(p - 1) T / (v m)`` for equal stages (the module docstring)."""
    pp = sum(n for _, n in piped)
    if pp < 2:
        return 0.0
    others = (sum(t * n for t, n in piped) - max(t for t, _ in piped)) / (pp - 1)
    return max(0.0, others) * bubble_fraction(pp, microbatches, vpp)


def estimate(
    cand: Candidate,
    *,
    stages: list[StageWork],
    cluster: Cluster,
    overlap: float,
    contention: float = 0.0,
) -> StepEstimate:
    """Step time from each stage's work (see the module docstring)."""
    times = [_stage_time(sw, cand, cluster, overlap, contention) for sw in stages]
    k = max(range(len(times)), key=lambda i: times[i].compute + times[i].exposed)
    slow, sw = times[k], stages[k]
    if cand.schedule == "zbv":  # a chunk is half the rank's layers: its passes / (2 m)
        _, b_share, w_share = zbv_passes(sw.parts)
        chunk = slow.piped / (2 * cand.microbatches)
        bubble = zbv_bubble(cand.pp, cand.microbatches, b_share * chunk, w_share * chunk)
    else:
        piped = [(t.piped, s.count) for t, s in zip(times, stages, strict=True)]
        bubble = pipeline_bubble(piped, cand.microbatches, cand.vpp)
    slow.timed.sort(key=lambda x: -x[1])
    return StepEstimate(
        compute_s=slow.compute,
        comm_blocking_s=slow.blocking,
        comm_overlappable_s=slow.nonblocking,
        comm_exposed_s=slow.exposed,
        bubble_s=bubble,
        step_s=slow.compute + slow.exposed + bubble,
        top_items=tuple(slow.timed[:3]),
        comm_hidden_s=slow.hidden,
        stage=sw.stage,
    )
