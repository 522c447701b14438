"""What a layout puts on the wire in one training step: THE table parlab's comm code reads.

``traffic(spec, topology, strategy, micro_batch=..., seq_len=...)`` lists
``WireItem``s for one rank (of pipeline ``stage``): which collective, over
which mesh axis and group size, the payload of one call, how many calls per
step, in which phase, and whether the caller waits on it (a sync point) or it
can overlap compute. The collectives benchmark's payload table, the training
runs' comm meters, the cost model and the planner all call this; nobody
re-derives it.

Payload = the size nccl-tests reports for that collective: all-reduce and
broadcast the buffer; all-gather and reduce-scatter the whole gathered
(scattered) buffer, i.e. ``shard x group``; all-to-all the whole send buffer of
one rank; send/recv the message.

Per strategy (Psi: this rank's parameter elements; u: one unit; m: micro-batches):

==============  ===========================================================================
ddp             all-reduce of every gradient over dp, in buckets of ``bucket_bytes``
                (default 25 MiB, torch's; a bucket closes once it holds that much, and a
                gradient is never split), once per step, overlapping backward: Psi x grad bytes
zero1           reduce-scatter of each unit's padded flat gradients after backward (once per
                step) + all-gather of each unit's padded flat params after the step
zero2           as zero1, but the reduce-scatter runs per unit per micro-batch during backward
zero3 / fsdp    per unit per micro-batch: all-gather before forward, all-gather again before
                backward, reduce-scatter of its gradients: 3 Psi per micro-batch (params in the
                gather dtype). FSDP's root unit (embeddings, head) is gathered once (kept);
                ``reshard_after_forward=False`` keeps every unit, so no backward all-gather,
                and under PP (torch's pipelining) one gather and one reduce-scatter a step.
fsdp-hybrid     fsdp over the shard group (axis ``dp_shard``) + all-reduce of each unit's
                gradient shard over the replicas (axis ``dp_replicate``) per micro-batch
tp              per layer per micro-batch, b s h x compute bytes each: 2 all-reduces forward
                (after attention and MLP) + 2 backward; with sp 2 all-gathers + 2
                reduce-scatters forward and the same backward (sync points: on the critical path)
pp              send/recv of one micro-batch's activations forward and its gradient backward,
                b s h x compute bytes (/tp with sp), per micro-batch and virtual stage
cp              ring attention: per layer per micro-batch, cp - 1 exchanges of the local K and V
                chunk forward; backward K, V again and dK, dV (float32)
ep              per MoE layer per micro-batch: all-to-all dispatch + combine forward, the same
                backward, tokens x top_k x h x compute bytes each
==============  ===========================================================================
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from parlab.ledger.policy import dtype_policy
from parlab.ledger.sharding import (
    flat_shard_numel,
    gradient_buckets,
    holding,
    stage_layers,
    unit_dim0_numel,
)
from parlab.ledger.stages import check_layout
from parlab.models.spec import ModelSpec
from parlab.topology import Topology

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast")
PHASES = ("forward", "backward", "after-backward", "optimizer-step")


@dataclass(frozen=True, kw_only=True)
class WireItem:
    """One kind of collective call a rank makes in a training step."""

    collective: str
    """``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``, ``send-recv``, ``broadcast``."""
    axis: str
    """Mesh axis it runs over (``dp``, ``dp_shard``, ``dp_replicate``, ``edp``, ``tp``, ``pp``, ``cp``, ``ep``)."""
    group_size: int
    """Ranks in the group."""
    payload_bytes: int
    """Bytes of one call, counted as nccl-tests counts size."""
    count_per_step: int
    """Calls per training step."""
    phase: str
    """``forward``, ``backward``, ``after-backward`` or ``optimizer-step``."""
    blocking: bool
    """True when compute waits for it (a sync point on the critical path); False when it
    overlaps compute (bucketed/prefetched)."""
    source: str
    """Which mechanism issues it (``ddp``, ``zero3``, ``tp``, ``pp``, ``cp``, ``ep``, ...)."""
    note: str = ""
    """What it carries."""

    @property
    def total_bytes(self) -> int:
        """Payload x count: bytes this item moves per step (nccl-tests size)."""
        return self.payload_bytes * self.count_per_step

    def to_json(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "axis": self.axis,
            "group_size": self.group_size,
            "payload_bytes": self.payload_bytes,
            "count_per_step": self.count_per_step,
            "total_bytes": self.total_bytes,
            "phase": self.phase,
            "blocking": self.blocking,
            "source": self.source,
            "note": self.note,
        }


def _by_size(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge ``(payload, count)`` pairs: largest payload first, zero sizes dropped."""
    c: Counter[int] = Counter()
    for size, k in sizes:
        if size > 0:
            c[size] += k
    return sorted(c.items(), key=lambda kv: -kv[0])


def _backward_grad_bytes(h: Any, *, expert: bool, grad_bytes: int) -> list[int]:
    """Each parameter's gradient bytes in the order backward makes them (the reverse of the
    forward order), of the routed experts' units or of the others."""
    out = []
    for name, params in reversed(h.units):
        if name.endswith(".experts") != expert:
            continue
        out += [math.prod(shape) * grad_bytes for _, shape in reversed(params)]
    return out


def traffic(
    spec: ModelSpec,
    topology: Topology | None = None,
    strategy: str = "ddp",
    *,
    micro_batch: int = 1,
    seq_len: int | None = None,
    dtype: str = "bf16-mixed",
    microbatches: int = 1,
    sp: bool = False,
    shard_size: int | None = None,
    virtual_stages: int = 1,
    loss_parallel: bool = False,
    bucket_bytes: int = 25 * 1024**2,
    reshard_after_forward: bool = True,
    stage: int = 0,
    v_shape: bool = False,
) -> list[WireItem]:
    """The wire table of one rank of pipeline ``stage`` (see the module docstring).

    ``v_shape``: the zero-bubble V (two chunks per rank, ``stage`` and ``2 pp - 1 - stage``):
    rank 0 holds the embeddings and the head, and the V's tip (chunks p - 1 and p, both on the
    last rank) passes its activations on the rank, not over the wire."""
    topo = topology or Topology(world_size=1)
    seq_len = seq_len or spec.max_seq_len
    pol = dtype_policy(dtype)
    n = check_layout(
        spec, topo, strategy=strategy, shard_size=shard_size, virtual_stages=virtual_stages
    )
    tp, pp, cp, ep, dp = topo.tp, topo.pp, topo.cp, topo.ep, topo.dp
    m = microbatches
    e = pol.compute_bytes
    gb, pb = pol.grad_bytes, pol.param_bytes
    gather_b = min(e, pb)
    h = holding(spec, tp=tp, pp=pp, ep=ep, stage=stage, virtual=virtual_stages, v_shape=v_shape)
    out: list[WireItem] = []

    def add(coll: str, axis: str, group: int, sizes: list[tuple[int, int]], count: int, phase: str,
            blocking: bool, source: str, note: str) -> None:  # fmt: skip
        if group <= 1 or count <= 0:
            return
        for size, c in _by_size(sizes):
            out.append(
                WireItem(
                    collective=coll, axis=axis, group_size=group, payload_bytes=size,
                    count_per_step=c * count, phase=phase, blocking=blocking, source=source,
                    note=note,
                )
            )  # fmt: skip

    # ---- data parallel --------------------------------------------------------------------
    # sizes are (payload, how many units) pairs; identical blocks are counted once
    ne = max(1, n // ep)
    dense_units = [(u, c) for u, c in h.groups if not u.expert]
    exp_units = [(u, c) for u, c in h.groups if u.expert]
    if strategy == "ddp":
        for expert, axis, group in ((False, "dp", dp), (True, "edp", dp // ep)):
            grads = _backward_grad_bytes(h, expert=expert, grad_bytes=gb)
            if grads:
                buckets = gradient_buckets(grads, bucket_bytes)  # torch never splits a gradient
                sizes = [(sum(grads[i] for i in b), 1) for b in buckets]
                add("all-reduce", axis, group, sizes, 1, "backward", False, "ddp",
                    "gradient buckets, averaged; once per step (no_sync while accumulating)")  # fmt: skip
    elif strategy in ("zero1", "zero2", "zero3"):
        for units, axis, group in ((dense_units, "dp", n), (exp_units, "edp", ne)):
            padded = [(flat_shard_numel(u.numel, group) * group, c) for u, c in units]
            grads = [(p * gb, c) for p, c in padded]
            if strategy == "zero1":
                add("reduce-scatter", axis, group, grads, 1, "after-backward",
                    True, "zero1", "each unit's padded flat gradients, once per step")  # fmt: skip
            else:
                add("reduce-scatter", axis, group, grads, m, "backward", False,
                    strategy, "each unit's padded flat gradients as soon as they are ready")  # fmt: skip
            if strategy == "zero3":
                gathered = [(p * gather_b, c) for p, c in padded]
                add("all-gather", axis, group, gathered, m, "forward", True,
                    "zero3", "each unit's params before its forward (gather dtype)")  # fmt: skip
                add("all-gather", axis, group, gathered, m, "backward", True,
                    "zero3", "each unit's params again before its backward")  # fmt: skip
            else:
                add("all-gather", axis, group, [(p * pb, c) for p, c in padded], 1,
                    "optimizer-step", True, strategy,
                    "each unit's updated padded flat params after the step")  # fmt: skip
    else:  # fsdp, fsdp-hybrid
        axis = "dp_shard" if strategy == "fsdp-hybrid" else "dp"
        plan = (
            (dense_units, axis, n, dp // n, "dp_replicate"),
            (exp_units, "edp", ne, dp // ep // ne, "edp"),
        )
        for units, ax, group, replicas, rep_axis in plan:
            root, blocks = [], []
            for us, c in units:
                u = unit_dim0_numel(us.shapes, group) * group
                (root if us.name in ("embeddings", "head") else blocks).append((u, c))
            # under PP without resharding, torch's pipelining keeps the parameters gathered
            # and the gradients unreduced across the step's micro-batches: once a step
            k = 1 if pp > 1 and not reshard_after_forward else m
            add("all-gather", ax, group, [(u * gather_b, c) for u, c in blocks + root], k,
                "forward", True, "fsdp",
                "each unit's params before its forward (prefetch overlaps the next)")  # fmt: skip
            if reshard_after_forward:
                add("all-gather", ax, group, [(u * gather_b, c) for u, c in blocks], m,
                    "backward", True, "fsdp",
                    "each block's params again before its backward (root kept)")  # fmt: skip
            add("reduce-scatter", ax, group, [(u * gb, c) for u, c in blocks + root], k,
                "backward", False, "fsdp", "each unit's gradients, averaged (reduce dtype)")  # fmt: skip
            if strategy == "fsdp-hybrid" and replicas > 1:
                add("all-reduce", rep_axis, replicas,
                    [(u // group * gb, c) for u, c in blocks + root], m, "backward", False,
                    "fsdp-hybrid", "each unit's gradient shard across the replica groups")  # fmt: skip

    # ---- tensor parallel --------------------------------------------------------------------
    tokens = micro_batch * seq_len // cp
    layer_ids = stage_layers(spec.layers, pp, stage, virtual_stages, v_shape=v_shape)
    first, last = stage == 0, stage == (0 if v_shape else pp - 1)
    act = tokens * spec.hidden * e
    nl = len(layer_ids)
    if tp > 1:
        if sp:
            for phase in ("forward", "backward"):
                add("all-gather", "tp", tp, [(act, 1)], 2 * nl * m, phase, True, "tp",
                    "sequence-parallel: gather b s h before attention and MLP")  # fmt: skip
                add("reduce-scatter", "tp", tp, [(act, 1)], 2 * nl * m, phase, True, "tp",
                    "sequence-parallel: scatter b s h after attention and MLP")  # fmt: skip
        else:
            add("all-reduce", "tp", tp, [(act, 1)], 2 * nl * m, "forward", True, "tp",
                "sum of b s h partial outputs after attention (wo) and MLP (w2)")  # fmt: skip
            add("all-reduce", "tp", tp, [(act, 1)], 2 * nl * m, "backward", True, "tp",
                "sum of b s h input gradients of attention and MLP")  # fmt: skip
        if first:
            add("all-reduce", "tp", tp, [(act, 1)], m, "forward", True, "tp",
                "vocab-parallel embedding output")  # fmt: skip
        if last and not loss_parallel:
            add("all-gather", "tp", tp, [(tokens * spec.vocab_size * e, 1)], m, "forward", True, "tp",
                "column-parallel output: gather the logits")  # fmt: skip
    # ---- pipeline ---------------------------------------------------------------------------
    if pp > 1:
        msg = act // (tp if sp else 1)
        # the V sends on from chunk k (not the tip's, on the rank) and 2p - 1 - k (not the last)
        sends = int(stage < pp - 1) + int(stage > 0) if v_shape else virtual_stages
        add("send-recv", "pp", pp, [(msg, 1)], m * sends, "forward", True, "pp",
            "one micro-batch's activations to the next stage")  # fmt: skip
        add("send-recv", "pp", pp, [(msg, 1)], m * sends, "backward", True, "pp",
            "their gradient back to the previous stage")  # fmt: skip
    # ---- context parallel -------------------------------------------------------------------
    if cp > 1:
        if spec.mla is not None:
            kv_local = spec.heads * (spec.mla.qk_head_dim + spec.mla.v_head_dim) // tp
        else:
            kv_local = 2 * max(1, spec.n_kv_heads // tp) * spec.d_head
        chunk = tokens * kv_local
        add("send-recv", "cp", cp, [(chunk * e, 1)], nl * m * (cp - 1), "forward", True, "cp",
            "ring attention: pass the local K and V chunk on")  # fmt: skip
        add("send-recv", "cp", cp, [(chunk * e, 1)], nl * m * (cp - 1), "backward", True, "cp",
            "ring attention backward: K and V chunk again")  # fmt: skip
        add("send-recv", "cp", cp, [(chunk * 4, 1)], nl * m * (cp - 1), "backward", True, "cp",
            "ring attention backward: dK and dV accumulators (float32)")  # fmt: skip
    # ---- expert parallel --------------------------------------------------------------------
    if ep > 1 and spec.moe is not None:
        moe_layers = sum(spec.is_moe_layer(i) for i in layer_ids)
        a2a = tokens * spec.moe.top_k * spec.hidden * e // (tp if sp else 1)
        for phase in ("forward", "backward"):
            add("all-to-all", "ep", ep, [(a2a, 1)], 2 * moe_layers * m, phase, True, "ep",
                "dispatch tokens to their experts and combine the results")  # fmt: skip
    return out


def summarize(items: list[WireItem]) -> dict[str, int]:
    """Total bytes per step by ``collective@axis``."""
    out: dict[str, int] = {}
    for it in items:
        key = f"{it.collective}@{it.axis}"
        out[key] = out.get(key, 0) + it.total_bytes
    return out


def sync_points(items: list[WireItem]) -> list[str]:
    """One line per blocking item: where compute waits, how often, for how much."""
    from parlab.units import format_bytes

    lines = []
    for it in items:
        if it.blocking:
            lines.append(
                f"{it.source}: {it.collective} over {it.axis} ({it.group_size}) in {it.phase}, "
                f"{it.count_per_step} x {format_bytes(it.payload_bytes)} per step"
            )
    return lines
