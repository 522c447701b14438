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
from parlab.units import format_bytes

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
    tp, pp, ep = topo.tp, topo.pp, topo.ep
    h = holding(spec, tp=tp, pp=pp, ep=ep, stage=stage, virtual=virtual_stages, v_shape=v_shape)
    tokens = micro_batch * seq_len // topo.cp
    r = _Rank(
        spec=spec, topo=topo, n=n, m=microbatches, e=pol.compute_bytes, gb=pol.grad_bytes,
        pb=pol.param_bytes, h=h, sp=sp, tokens=tokens, act=tokens * spec.hidden * pol.compute_bytes,
        layer_ids=stage_layers(spec.layers, pp, stage, virtual_stages, v_shape=v_shape),
        stage=stage, v_shape=v_shape, virtual_stages=virtual_stages,
    )  # fmt: skip
    w = _Wire()
    if strategy == "ddp":
        _ddp(w, r, bucket_bytes)
    elif strategy in ("zero1", "zero2", "zero3"):
        _zero(w, r, strategy)
    else:  # fsdp, fsdp-hybrid
        _fsdp(w, r, strategy, reshard_after_forward)
    _tensor_parallel(w, r, loss_parallel)
    _pipeline(w, r)
    _context_parallel(w, r)
    _expert_parallel(w, r)
    return w.out


@dataclass(frozen=True, kw_only=True)
class _Rank:
    """What the wire table of one rank is computed from."""

    spec: ModelSpec
    topo: Topology
    n: int
    """Ranks the dense parameters are sharded over (``check_layout``)."""
    m: int
    """Micro-batches per step."""
    e: int
    """Compute (activation) bytes per element."""
    gb: int
    """Gradient bytes per element."""
    pb: int
    """Parameter bytes per element."""
    h: Any
    """What the rank holds (``parlab.ledger.sharding.holding``)."""
    sp: bool
    tokens: int
    """Tokens of one micro-batch on the rank (its context-parallel share)."""
    act: int
    """Bytes of one micro-batch's b s h activations."""
    layer_ids: list[int]
    stage: int
    v_shape: bool
    virtual_stages: int

    @property
    def gather_b(self) -> int:
        """Bytes per element of a parameter gather (the compute dtype where it is narrower)."""
        return min(self.e, self.pb)

    def units(self, expert: bool) -> list[tuple[Any, int]]:
        """(unit, how many alike) of the rank's routed-expert units or of the others."""
        return [(u, c) for u, c in self.h.groups if u.expert == expert]


class _Wire:
    """The wire table being built: ``add`` appends one item per distinct payload."""

    def __init__(self) -> None:
        self.out: list[WireItem] = []

    def add(self, coll: str, axis: str, group: int, sizes: list[tuple[int, int]], count: int,
            phase: str, blocking: bool, source: str, note: str) -> None:  # fmt: skip
        if group <= 1 or count <= 0:
            return
        for size, c in _by_size(sizes):
            self.out.append(
                WireItem(
                    collective=coll, axis=axis, group_size=group, payload_bytes=size,
                    count_per_step=c * count, phase=phase, blocking=blocking, source=source,
                    note=note,
                )
            )  # fmt: skip


# ---- data parallel ------------------------------------------------------------------------
# sizes are (payload, how many units) pairs; identical blocks are counted once


def _ddp(w: _Wire, r: _Rank, bucket_bytes: int) -> None:
    dp, ep = r.topo.dp, r.topo.ep
    for expert, axis, group in ((False, "dp", dp), (True, "edp", dp // ep)):
        grads = _backward_grad_bytes(r.h, expert=expert, grad_bytes=r.gb)
        if grads:
            buckets = gradient_buckets(grads, bucket_bytes)  # torch never splits a gradient
            sizes = [(sum(grads[i] for i in b), 1) for b in buckets]
            w.add("all-reduce", axis, group, sizes, 1, "backward", False, "ddp",
                  "gradient buckets, averaged; once per step (no_sync while accumulating)")  # fmt: skip


def _zero(w: _Wire, r: _Rank, strategy: str) -> None:
    ne = max(1, r.n // r.topo.ep)
    for units, axis, group in ((r.units(False), "dp", r.n), (r.units(True), "edp", ne)):
        padded = [(flat_shard_numel(u.numel, group) * group, c) for u, c in units]
        grads = [(p * r.gb, c) for p, c in padded]
        if strategy == "zero1":
            w.add("reduce-scatter", axis, group, grads, 1, "after-backward",
                  True, "zero1", "each unit's padded flat gradients, once per step")  # fmt: skip
        else:
            w.add("reduce-scatter", axis, group, grads, r.m, "backward", False,
                  strategy, "each unit's padded flat gradients as soon as they are ready")  # fmt: skip
        if strategy == "zero3":
            gathered = [(p * r.gather_b, c) for p, c in padded]
            w.add("all-gather", axis, group, gathered, r.m, "forward", True,
                  "zero3", "each unit's params before its forward (gather dtype)")  # fmt: skip
            w.add("all-gather", axis, group, gathered, r.m, "backward", True,
                  "zero3", "each unit's params again before its backward")  # fmt: skip
        else:
            w.add("all-gather", axis, group, [(p * r.pb, c) for p, c in padded], 1,
                  "optimizer-step", True, strategy,
                  "each unit's updated padded flat params after the step")  # fmt: skip


def _fsdp(w: _Wire, r: _Rank, strategy: str, reshard_after_forward: bool) -> None:
    dp, ep, pp, n, m = r.topo.dp, r.topo.ep, r.topo.pp, r.n, r.m
    ne = max(1, n // ep)
    axis = "dp_shard" if strategy == "fsdp-hybrid" else "dp"
    plan = (
        (r.units(False), axis, n, dp // n, "dp_replicate"),
        (r.units(True), "edp", ne, dp // ep // ne, "edp"),
    )
    gather_b, gb = r.gather_b, r.gb
    for units, ax, group, replicas, rep_axis in plan:
        root, blocks = [], []
        for us, c in units:
            u = unit_dim0_numel(us.shapes, group) * group
            (root if us.name in ("embeddings", "head") else blocks).append((u, c))
        # under PP without resharding, torch's pipelining keeps the parameters gathered
        # and the gradients unreduced across the step's micro-batches: once a step
        k = 1 if pp > 1 and not reshard_after_forward else m
        w.add("all-gather", ax, group, [(u * gather_b, c) for u, c in blocks + root], k,
              "forward", True, "fsdp",
              "each unit's params before its forward (prefetch overlaps the next)")  # fmt: skip
        if reshard_after_forward:
            w.add("all-gather", ax, group, [(u * gather_b, c) for u, c in blocks], m,
                  "backward", True, "fsdp",
                  "each block's params again before its backward (root kept)")  # fmt: skip
        w.add("reduce-scatter", ax, group, [(u * gb, c) for u, c in blocks + root], k,
              "backward", False, "fsdp", "each unit's gradients, averaged (reduce dtype)")  # fmt: skip
        if strategy == "fsdp-hybrid" and replicas > 1:
            w.add("all-reduce", rep_axis, replicas,
                  [(u // group * gb, c) for u, c in blocks + root], m, "backward", False,
                  "fsdp-hybrid", "each unit's gradient shard across the replica groups")  # fmt: skip


def _tensor_parallel(w: _Wire, r: _Rank, loss_parallel: bool) -> None:
    tp, pp, m, act, nl = r.topo.tp, r.topo.pp, r.m, r.act, len(r.layer_ids)
    if tp <= 1:
        return
    first, last = r.stage == 0, r.stage == (0 if r.v_shape else pp - 1)
    if r.sp:
        for phase in ("forward", "backward"):
            w.add("all-gather", "tp", tp, [(act, 1)], 2 * nl * m, phase, True, "tp",
                  "sequence-parallel: gather b s h before attention and MLP")  # fmt: skip
            w.add("reduce-scatter", "tp", tp, [(act, 1)], 2 * nl * m, phase, True, "tp",
                  "sequence-parallel: scatter b s h after attention and MLP")  # fmt: skip
    else:
        w.add("all-reduce", "tp", tp, [(act, 1)], 2 * nl * m, "forward", True, "tp",
              "sum of b s h partial outputs after attention (wo) and MLP (w2)")  # fmt: skip
        w.add("all-reduce", "tp", tp, [(act, 1)], 2 * nl * m, "backward", True, "tp",
              "sum of b s h input gradients of attention and MLP")  # fmt: skip
    if first:
        w.add("all-reduce", "tp", tp, [(act, 1)], m, "forward", True, "tp",
              "vocab-parallel embedding output")  # fmt: skip
    if last and not loss_parallel:
        w.add("all-gather", "tp", tp, [(r.tokens * r.spec.vocab_size * r.e, 1)], m, "forward",
              True, "tp", "column-parallel output: gather the logits")  # fmt: skip


def _pipeline(w: _Wire, r: _Rank) -> None:
    pp, stage = r.topo.pp, r.stage
    if pp <= 1:
        return
    msg = r.act // (r.topo.tp if r.sp else 1)
    # the V sends on from chunk k (not the tip's, on the rank) and 2p - 1 - k (not the last)
    sends = int(stage < pp - 1) + int(stage > 0) if r.v_shape else r.virtual_stages
    w.add("send-recv", "pp", pp, [(msg, 1)], r.m * sends, "forward", True, "pp",
          "one micro-batch's activations to the next stage")  # fmt: skip
    w.add("send-recv", "pp", pp, [(msg, 1)], r.m * sends, "backward", True, "pp",
          "their gradient back to the previous stage")  # fmt: skip


def _context_parallel(w: _Wire, r: _Rank) -> None:
    spec, cp, tp = r.spec, r.topo.cp, r.topo.tp
    if cp <= 1:
        return
    if spec.mla is not None:
        kv_local = spec.heads * (spec.mla.qk_head_dim + spec.mla.v_head_dim) // tp
    else:
        kv_local = 2 * max(1, spec.n_kv_heads // tp) * spec.d_head
    chunk = r.tokens * kv_local
    calls = len(r.layer_ids) * r.m * (cp - 1)
    w.add("send-recv", "cp", cp, [(chunk * r.e, 1)], calls, "forward", True, "cp",
          "ring attention: pass the local K and V chunk on")  # fmt: skip
    w.add("send-recv", "cp", cp, [(chunk * r.e, 1)], calls, "backward", True, "cp",
          "ring attention backward: K and V chunk again")  # fmt: skip
    w.add("send-recv", "cp", cp, [(chunk * 4, 1)], calls, "backward", True, "cp",
          "ring attention backward: dK and dV accumulators (float32)")  # fmt: skip


def _expert_parallel(w: _Wire, r: _Rank) -> None:
    spec, ep = r.spec, r.topo.ep
    if ep <= 1 or spec.moe is None:
        return
    moe_layers = sum(spec.is_moe_layer(i) for i in r.layer_ids)
    a2a = r.tokens * spec.moe.top_k * spec.hidden * r.e // (r.topo.tp if r.sp else 1)
    for phase in ("forward", "backward"):
        w.add("all-to-all", "ep", ep, [(a2a, 1)], 2 * moe_layers * r.m, phase, True, "ep",
              "dispatch tokens to their experts and combine the results")  # fmt: skip


def summarize(items: list[WireItem]) -> dict[str, int]:
    """Total bytes per step by ``collective@axis``."""
    out: dict[str, int] = {}
    for it in items:
        key = f"{it.collective}@{it.axis}"
        out[key] = out.get(key, 0) + it.total_bytes
    return out


def sync_points(items: list[WireItem]) -> list[str]:
    """One line per blocking item: where compute waits, how often, for how much."""
    lines = []
    for it in items:
        if it.blocking:
            lines.append(
                f"{it.source}: {it.collective} over {it.axis} ({it.group_size}) in {it.phase}, "
                f"{it.count_per_step} x {format_bytes(it.payload_bytes)} per step"
            )
    return lines
