"""The memory ledger: per-rank bytes of one training (or inference) layout, as named items.

``predict(spec, strategy=..., topology=..., micro_batch=..., seq_len=...)``
returns a ``Ledger``: every item in bytes on every pipeline stage (ranks of
one stage hold the same bytes; ``Ledger.per_rank`` spreads them over the
world), and the predicted peak with the phase it happens in. Pure arithmetic:
no torch, no process group; microseconds per call.

State items (exact: what the tensors of a real implementation hold, by the
rules of ``parlab.ledger.sharding``):

=================  =========================================================================
item               bytes per rank (P: parameters this rank's stage holds after TP/PP/EP)
=================  =========================================================================
``params``         ddp: P x param_bytes. zero1/zero2: the padded flat units (sum of
                   ``ceil(u / N) * N``) x param_bytes. zero3: ``sum ceil(u / N)``.
                   fsdp / fsdp-hybrid: ``sum ceil(dim0 / N) * rest`` per parameter.
``grads``          as params with grad_bytes; zero1 keeps full flat grads, zero2/zero3 shards.
``optimizer``      AdamW: exp_avg + exp_avg_sq (2 x state_bytes) of what the optimizer steps
                   on (ddp: P; zero*: the shards; fsdp: the dim-0 shards). SGD: none;
                   sgd-momentum: 1. Adam's ``step`` scalars are not counted (host scalars
                   in torch's default AdamW; parlab's meters skip them too).
``master_params``  fp32 master copy where the dtype policy keeps one (``bf16-params``),
                   sharded like the optimizer states.
``master_grads``   its fp32 gradient: the reduced gradient cast for the optimizer step
                   (``bf16-params``; optimizer phase only), sharded like the master.
=================  =========================================================================

N is the shard count: ``dp`` (``fsdp-hybrid``: ``shard_size``); routed experts
(ep > 1) shard over ``N / ep``.

Activations follow the dtype policy: under ``bf16-compute`` DDP/ZeRO-1/2 run
autocast over fp32 parameters (fp32 residual stream, a bf16 copy per linear
input); ZeRO-3 and FSDP gather their parameters in bf16 and run the whole
forward in it (bf16 residual, no casts), as FSDP2's ``param_dtype`` does.

Transient items (the forward/backward phase): ``activations`` (per layer from
``parlab.ledger.activations``, times the micro-batches in flight; with ``sp`` the
column-parallel linears' inputs are ``S/t`` per rank as Megatron keeps them -- saved
sharded, re-gathered in backward -- or, with ``sp_saves_gathered=True``, the whole
gathered sequence, as parlab's SP keeps it: on 2 gloo ranks that is exact to 0.1 %; with
``sp_gather="per-linear"``, parlab's SP before commit 02e7fd8, each of wq/wk/wv and w1/w3 keeps
its own copy of it at micro-batch > 1 -- ``parlab.ledger.activations`` says why --, three more
``B x S x H`` per SwiGLU block: on 2 gloo ranks the model-internal loop with the all-gather
of before that commit peaks where the ledger says to 0.1 %, and the 2xH200 runs of 1.3B at
2 x 4096 made before it measure 1.1 % above it (explicit and fused RMSNorm alike, as the runs
made after it) where the shared ledger was 15.8 % and 17.4 % under),
``recompute_buffer`` (full recompute: one layer's activations during its
backward; ``op-selective``: the part of one layer's activations it recomputes,
alive in that layer's backward, after the loss region -- counted with the block's
activation gradients as if all alive at once, a bound: 3.6 % over the tracked peak
of the tiny model on the CPU, exact where the loss region sets the peak), ``logits`` (the float32
logits the loss reads, ``tokens x vocab x 4``; under bf16 a cast copy of the bf16
output, which is freed), ``loss_buffers``
(float32 log-probabilities kept by cross-entropy and their gradient:
``2 x tokens x vocab x 4``; with ``loss_parallel`` parlab's vocab-parallel
cross-entropy over ``vocab / tp``: its saved softmax, and in backward the one-hot
target and its masked copy beside the new gradient, ``3 x tokens x vocab/tp x 4``),
``pending_loss_buffers`` (GPipe: every micro-batch's loss is computed at the end of
its forward, so on the last stage the other ``m - 1`` keep their log-probs until
their backward), ``held_logits`` (``logits_held=True``: the
loop keeps the model's output, ``tokens x vocab x e``, until backward ends --
torchtitan deletes it instead), ``backward_transient`` (one block's
activation gradients: ``tokens x (2 f + 2 h) x e``), ``autocast_weight_copies``
(bf16 copies of fp32 matmul weights autocast makes and autograd keeps until
backward), ``gather_buffers`` (ZeRO-3: the unit in use and the prefetched
block, unsharded, in the gather dtype; FSDP: its root unit -- embeddings and
head, kept through the step -- and the prefetched block; every unit with
``reshard_after_forward=False``), ``reduce_buffers``
(ZeRO-2/3/FSDP: one unit's unsharded gradients before their reduce-scatter,
in backward), ``ddp_buckets`` (resident: DDP's gradient buckets, a copy of
every gradient unless ``bucket_view``), ``ddp_old_buckets`` (``ddp_old_buckets=True``:
DDP's first-iteration buckets, still alive through the second iteration's
forward/backward -- see below).
Optimizer phase: ``optimizer_temporaries`` (foreach AdamW: one state-sized
temporary, ``sqrt(v)``; fused AdamW: none). ``allocator_overhead``: an
explicit, settable number (``overhead_bytes``), never a hidden factor.

Peak (per stage) = resident (params, optimizer, master, ddp_buckets, overhead, and
the gradients where they live in persistent buffers: DDP with ``bucket_view``,
ZeRO-1's flat gradient buffers) + max(forward/backward, optimizer step), where

- forward/backward = activations + recompute_buffer + autocast_weight_copies +
  gather_buffers + held_logits + ddp_old_buckets + gradients already accumulated (all of them
  when they accumulate over micro-batches: ``microbatches > 1`` or pp > 1) +
  max(logits + loss_buffers, backward_transient + the output unit's whole
  gradients + reduce_buffers): the loss region is freed before the blocks'
  backward starts;
- optimizer step = grads + optimizer_temporaries;
- FSDP's end of backward = grads + reduce_buffers: every sharded gradient made, and the last
  unit's reduce-scatter input beside them -- the root's (embeddings, final norm and output, the
  largest unit), its gradients in ``reduce_dtype`` before their reduce-scatter. On one gloo
  rank (the small model, bf16 parameters gathered, float32 reduce) the tracked peak is that to
  0.1 % (``tests/test_ledger_revisions.py``); on one H200 (``parlab train --strategy fsdp
  --nproc 1``, 1 x 1024, full recompute) Llama-3.1 8B peaked at 133.0 GB and Qwen2.5 7B at
  127.0 GB, where this phase says 132.7 and 126.2 and the optimizer step 128.5 and 121.9.

GPipe (every forward before any backward; ``zero_grad(set_to_none)`` before the step) peaks
at the start of the first backward, with no gradients yet, or at its end, every gradient
made and one micro-batch's activations freed: the accumulated gradients above are
``max(0, grads - one micro-batch's activations)``. ``vocab_parallel=False``: under TP the
embeddings and the output layer stay whole on every rank (torch's ``parallelize_module``
plan over the blocks), so no ``loss_parallel``.

The model-internal runs on 2 gloo ranks (the small model, bf16: one rank, TP2, torch's
DTensor TP2, GPipe on one and two stages) peak at the ledger's bytes to 0.6 %
(``tests/test_ledger_revisions.py``).

``ddp_old_buckets`` (torch DDP over NCCL, dp > 1): DDP allocates its gradient
buckets at construction in reverse parameter order, and before the second
iteration's forward (``_rebuild_buckets``, once per run unless
``static_graph``/``find_unused_parameters``) allocates new buckets in the order
the gradients arrived, copies the gradients in and points them at the new
buffers. The old buffers are not freed then: ProcessGroupNCCL keeps a reference
to the tensors of every async collective until ``Work.wait()`` (its
allocator-safety stash, unconditional since ``record_stream`` was removed:
pytorch PRs 148590 and 150079), and DDP's reducer waits on the collective's
future, never on the ``Work``; the watchdog (which polls) drops the reference
only after it has seen the all-reduce complete, and the tensors go at a later
collective call -- after the rebuild has already allocated the new buckets. So
the second iteration's forward and the start of its backward (the peak) hold one
extra set of buckets: ``P x grad bytes``. On the 2xH200 DDP run (1.3B, bf16
autocast, fp32 grads) the measured peak exceeds the steady-state ledger by
5.64 GiB; 5.08 GiB of it is this item (``4 B x 1.364e9``, equal to the excess
beyond ZeRO-1's within 3 MB; ZeRO-1 runs the same loop and dtypes without DDP
and is 0.56 GiB over: the held logits, ``logits_held``). The mechanism is read
from torch's source, not traced on the GPU; the size is measured. gloo keeps no
such reference (the CPU runs show no excess), so the knob is off by default: set
it for NCCL runs. Whether the watchdog drops the hold before the second step's peak
is a race: held at the 1.3B (iteration peaks 34.14 / 49.42 / 44.34 / 44.34 GiB, the
second +5.08 GiB), not at GPT-2 1.5B (43.99 / 55.64 / 55.64 / 55.64 GiB), so the
item is an upper bound (``scripts/gpu/accuracy.sh``). ``parlab train`` removes the
race (``TorchDDP.release_first_buckets`` after the first step) and predicts its runs
without the item; ``parlab fit`` keeps it, the bound for a loop that does not.

``ddp_rebuild``: torch DDP rebuilds its buckets once, before the second iteration's forward
(``_rebuild_buckets``): it allocates the new buckets, copies the gradients in and only then
lets the old ones go, so for that moment the rank holds its resident states plus a second set
of buckets (``P x grad bytes``) and nothing else -- no activations, no loss. Where activations
dominate this hides under the forward/backward peak (the 1.3B at 2 x 4096: 27.3 GB against
47.6 GB); where the states fill the GPU it is the peak. On one H200, Llama-2 7B under DDP
(micro-batch 1 x 1024, full recompute) peaked at 125.64 GiB: its resident states (100.41 GiB)
plus its fp32 gradients (25.10 GiB), where the forward/backward ledger said 113.55 GiB
(``results/PAR-TRAINING-STATE/train-ddp-llama2-7b-20261201T043505-197454.json``); Qwen2.5 7B,
with the rebuild 141.9 GiB of the GPU's 139.8, ran out of memory. ``ddp_old_buckets``, where
set, already holds that second set through the whole second iteration.

``ddp_one_rank``: torch DDP on a single rank (``parlab train --strategy ddp --nproc 1``) has
no special case: its reducer allocates the gradient buckets as on many ranks, and with
``bucket_view`` the gradients live in them for good. With dp x cp = 1 the ledger otherwise
prices a model that no DDP wraps (the model-internal runs' one-rank baselines). On one H200
(1.3B, bf16 autocast, micro-batch 2 x 4096) the run peaked at 47.61 GB, as its 2-rank twin,
where the unwrapped ledger said 42.08 GB: the 1.3B's fp32 gradients
(``results/PAR-TRAINING-STATE/train-ddp-1.3b-20261201T031652-5b88bf.json``).

Checked on the CPU against the tracked tensor bytes of real steps of the
reference model (``tests/test_ledger.py``): one rank in fp32, bf16 and autocast
and DDP on two gloo ranks within 1%; state items exact against torch's AdamW
and FSDP2 (per rank, with padding); FSDP2's bf16 forward activations within 2%.

CPU offload moves items to the host (``offload="optimizer"``: optimizer and
master; ``"params"``: params, grads, optimizer and master); host items are
listed with ``on_device=False`` and left out of the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from parlab.dtypes import check_recipe
from parlab.errors import UsageError
from parlab.ledger import activations as act
from parlab.ledger.sharding import (
    check_ep,
    check_pp,
    check_tp,
    dim0_chunk_numel,
    flat_shard_numel,
    holding,
    unit_dim0_numel,
)
from parlab.models.spec import ModelSpec
from parlab.topology import Topology

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid")
"""Data-parallel strategies (``fsdp`` is FSDP2 full shard; zero3 the flat-unit form)."""

OFFLOADS = ("none", "optimizer", "params")


@dataclass(frozen=True, kw_only=True)
class DtypePolicy:
    """Element sizes of each kind of tensor under one precision recipe."""

    name: str
    """Policy name."""
    param_bytes: int
    """Bytes per parameter element as stored (and as the optimizer updates it)."""
    grad_bytes: int
    """Bytes per gradient element (and of the gradient reduction)."""
    master_bytes: int
    """Bytes per element of a separate master copy (0: none; the params are the master)."""
    state_bytes: int
    """Bytes per optimizer-state element (AdamW's exp_avg, exp_avg_sq)."""
    compute_bytes: int
    """Bytes per element of activations and of gathered (ZeRO-3/FSDP) parameters."""
    residual_bytes: int
    """Bytes per element of the residual stream (fp32 under autocast)."""
    autocast: bool
    """Compute runs under ``torch.autocast`` over fp32 parameters."""


POLICIES: dict[str, DtypePolicy] = {
    "fp32": DtypePolicy(
        name="fp32", param_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4,
        compute_bytes=4, residual_bytes=4, autocast=False,
    ),
    # fp32 params are the master copy; bf16 compute (autocast, or FSDP2's param_dtype=bf16
    # with reduce_dtype=fp32): the common torch recipe.
    "bf16-compute": DtypePolicy(
        name="bf16-compute", param_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4,
        compute_bytes=2, residual_bytes=4, autocast=True,
    ),
    # bf16 params and grads with a separate fp32 master (Megatron / DeepSpeed): 2+2+4+8.
    "bf16-params": DtypePolicy(
        name="bf16-params", param_bytes=2, grad_bytes=2, master_bytes=4, state_bytes=4,
        compute_bytes=2, residual_bytes=2, autocast=False,
    ),
    # everything bf16, AdamW states too (torch's AdamW allocates them in the param dtype).
    "bf16-all": DtypePolicy(
        name="bf16-all", param_bytes=2, grad_bytes=2, master_bytes=0, state_bytes=2,
        compute_bytes=2, residual_bytes=2, autocast=False,
    ),
}  # fmt: skip

OPTIMIZERS: dict[str, tuple[int, bool]] = {
    "adamw": (2, True),
    "adamw-fused": (2, False),
    "adam": (2, True),
    "sgd": (0, False),
    "sgd-momentum": (1, False),
}
"""Optimizer -> (state tensors per parameter, whether a foreach step makes a state-sized temporary)."""


def runs_autocast(dtype: str | DtypePolicy, strategy: str) -> bool:
    """Whether the blocks compute under autocast over fp32 parameters: the policy's autocast,
    except where ZeRO-3/FSDP gather the parameters already in the compute dtype (FSDP2's
    param_dtype, ZeRO-3's gather dtype) and the whole forward runs in it."""
    pol = dtype_policy(dtype)
    sharded = strategy in ("zero3", "fsdp", "fsdp-hybrid")
    return pol.autocast and not (sharded and pol.param_bytes > pol.compute_bytes)


def models_compiled(
    spec: ModelSpec, *, dtype: str | DtypePolicy, strategy: str, recompute: str
) -> bool:
    """Whether the ledger's ``norm_kernel="compiled"`` describes this run's torch.compile'd
    blocks: every block ``compiled_modelled`` (dense SwiGLU, no autocast) and no op-level
    selective recompute (whose policy would choose what is kept as well)."""
    autocast = runs_autocast(dtype, strategy)
    return recompute != "op-selective" and all(
        act.compiled_modelled(spec, i, autocast=autocast) for i in range(spec.layers)
    )


def dtype_policy(name: str | DtypePolicy) -> DtypePolicy:
    """The named recipe (``parlab.dtypes.RECIPES``: ``fp32``, ``bf16-compute``, ``bf16-params``,
    ``bf16-all``); a retired name is ``UsageError`` naming the new one.

    ``LEDGER_SPELLINGS`` (the ledger's own names before ``docs/cli.md``) still resolve while
    ``parlab.plan`` passes them; every command's ``--dtype`` refuses them at parse time."""
    if isinstance(name, DtypePolicy):
        return name
    key = LEDGER_SPELLINGS.get(name, name)
    if key not in POLICIES:
        check_recipe(name)  # the one line naming the new spelling
    return POLICIES[key]


LEDGER_SPELLINGS = {"bf16-mixed": "bf16-compute", "bf16-master": "bf16-params", "bf16": "bf16-all"}


@dataclass(frozen=True, kw_only=True)
class LedgerItem:
    """One named entry of the ledger."""

    name: str
    """Stable item name (``params``, ``grads``, ``optimizer``, ``activations``, ...)."""
    per_stage: tuple[int, ...]
    """Bytes on a rank of each pipeline stage (length pp)."""
    kind: str
    """``state``, ``transient`` (forward/backward), ``optimizer-step``, ``buffer`` or ``overhead``."""
    formula: str
    """How it is computed, in words."""
    on_device: bool = True
    """False when offloaded to host memory (not in the device peak)."""

    @property
    def bytes(self) -> int:
        """The largest value over stages (the value of every rank when pp = 1)."""
        return max(self.per_stage)


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """Per-rank memory of one layout."""

    model: str
    """Spec name."""
    strategy: str
    """Data-parallel strategy."""
    topology: Topology
    """The layout's degrees."""
    knobs: dict[str, Any]
    """Every other input (batch, sequence, dtype, optimizer, recompute, schedule, ...)."""
    items: tuple[LedgerItem, ...]
    """Named items in ledger order."""
    peak_per_stage: tuple[int, ...]
    """Predicted peak device bytes on a rank of each stage."""
    peak_phase: tuple[str, ...]
    """Where each stage's peak happens: ``forward-backward``, ``end-of-backward`` (FSDP),
    ``optimizer-step`` or ``ddp-bucket-rebuild``."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Assumptions a reader needs."""
    shard_detail: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    """Items that differ by shard index (FSDP's unpadded optimizer states): item -> per stage
    -> bytes per shard index 0..N-1. Filled when N <= 64."""
    shard_count: int = 1
    """N, the shard count of ``strategy`` (shard index of a rank = its dp coordinate mod N)."""

    def item(self, name: str) -> LedgerItem | None:
        for it in self.items:
            if it.name == name:
                return it
        return None

    def value(self, name: str, stage: int = 0) -> int:
        """Bytes of item ``name`` on a rank of ``stage`` (0 when absent)."""
        it = self.item(name)
        return 0 if it is None else it.per_stage[stage]

    @property
    def peak_bytes(self) -> int:
        """The largest per-rank peak over all ranks."""
        return max(self.peak_per_stage)

    def state_bytes(self, stage: int = 0) -> int:
        """Params + grads + optimizer + master on a rank of ``stage`` (device or host)."""
        return sum(self.value(n, stage) for n in ("params", "grads", "optimizer", "master_params"))

    def per_rank(self, name: str | None = None) -> list[int]:
        """Item ``name`` (or the peak, when None) on every rank 0..world-1."""
        topo = self.topology
        vals = (
            self.peak_per_stage if name is None else (self.item(name) or _zero(topo.pp)).per_stage
        )
        detail = self.shard_detail.get(name or "")
        out = []
        for r in range(topo.world_size):
            c = topo.coords(r)
            if detail is not None:
                out.append(detail[c["pp"]][c["dp"] % self.shard_count])
            else:
                out.append(vals[c["pp"]])
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "strategy": self.strategy,
            "topology": self.topology.to_json(),
            "knobs": dict(self.knobs),
            "items": [
                {
                    "name": it.name,
                    "bytes": it.bytes,
                    "per_stage": list(it.per_stage),
                    "kind": it.kind,
                    "on_device": it.on_device,
                    "formula": it.formula,
                }
                for it in self.items
            ],
            "peak_bytes": self.peak_bytes,
            "peak_per_stage": list(self.peak_per_stage),
            "peak_phase": list(self.peak_phase),
            "notes": list(self.notes),
            "shard_count": self.shard_count,
            "shard_detail": {k: [list(x) for x in v] for k, v in self.shard_detail.items()},
        }


def _zero(pp: int) -> LedgerItem:
    return LedgerItem(name="", per_stage=(0,) * pp, kind="state", formula="")


def _positive(**values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name} = {v!r}: give a whole number of at least 1")


def check_layout(
    spec: ModelSpec,
    topology: Topology,
    *,
    strategy: str,
    shard_size: int | None = None,
    virtual_stages: int = 1,
    kv_replicate: bool = True,
) -> int:
    """Validate a layout for ``spec``; return the shard count N. ``UsageError`` names the field."""
    if strategy not in STRATEGIES:
        raise UsageError(f"strategy = {strategy!r}: use one of {', '.join(STRATEGIES)}")
    check_tp(spec, topology.tp, kv_replicate=kv_replicate)
    check_pp(spec, topology.pp, virtual_stages)
    check_ep(spec, topology.ep)
    n = topology.dp
    if strategy == "fsdp-hybrid":
        if shard_size is None:
            raise UsageError("fsdp-hybrid needs shard_size (ranks of one shard group)")
        _positive(shard_size=shard_size)
        if topology.dp % shard_size:
            raise UsageError(f"shard_size = {shard_size} does not divide dp = {topology.dp}")
        n = shard_size
    if strategy == "zero3" and spec.tied_embeddings:
        raise UsageError(
            "zero3 gathers per unit and cannot shard tied embeddings: use fsdp or an untied model"
        )
    return n


@dataclass(frozen=True)
class _StageNumbers:
    params: int
    grads: int
    optim: int
    largest_unit: int
    largest_block: int
    root: int
    held: int
    matmul: int
    head: int
    chunks: tuple[int, ...] | None
    unsharded: int = 0
    block_matmul: int = 0
    """Matmul elements of this stage's largest block (what autocast casts for one block)."""
    blocks_matmul: int = 0
    """Matmul elements of every block of this stage (the weights full recompute re-casts)."""


@lru_cache(maxsize=65536)
def _stage_numbers(
    spec: ModelSpec,
    tp: int,
    pp: int,
    ep: int,
    stage: int,
    virtual: int,
    strategy: str,
    n: int,
    vocab_parallel: bool = True,
    v_shape: bool = False,
) -> _StageNumbers:
    """Element counts of one stage's rank under a strategy (cached: fit calls this a lot)."""
    h = holding(
        spec, tp=tp, pp=pp, ep=ep, stage=stage, virtual=virtual, vocab_parallel=vocab_parallel,
        v_shape=v_shape,
    )  # fmt: skip
    held = h.numel
    matmul = h.matmul_numel
    head = sum(u.numel for u in h.sizes if u.name == "head")
    block_mm = [u.matmul for u in h.sizes if u.name not in ("embeddings", "head")]
    mm = {"block_matmul": max(block_mm, default=0), "blocks_matmul": sum(block_mm)}
    ne = max(1, n // ep)
    if strategy == "ddp":
        return _StageNumbers(
            params=held, grads=held, optim=held, largest_unit=max(h.unit_numels()),
            largest_block=0, root=0, held=held, matmul=matmul, head=head, chunks=None, **mm,
        )  # fmt: skip
    if strategy in ("zero1", "zero2", "zero3"):
        dense, exp = h.unit_numels(experts=False), h.unit_numels(experts=True)
        shard = sum(flat_shard_numel(u, n) for u in dense) + sum(
            flat_shard_numel(u, ne) for u in exp
        )
        padded = sum(flat_shard_numel(u, n) * n for u in dense) + sum(
            flat_shard_numel(u, ne) * ne for u in exp
        )
        largest = math.ceil(max(h.unit_numels()) / n) * n
        blocks = [u.numel for u in h.sizes if u.name not in ("embeddings", "head")]
        block = math.ceil(max(blocks, default=0) / n) * n
        return _StageNumbers(
            params=shard if strategy == "zero3" else padded,
            grads=padded if strategy == "zero1" else shard,
            optim=shard, largest_unit=largest, largest_block=block, root=0, held=held,
            matmul=matmul, head=head,
            chunks=None, **mm,
        )  # fmt: skip
    # fsdp / fsdp-hybrid: dim-0 shards of every parameter (identical shapes counted once)
    shard = 0
    root = 0
    largest = 0
    unsharded = 0
    for us in h.sizes:
        group = ne if us.expert else n
        u = unit_dim0_numel(us.shapes, group)
        shard += u
        unsharded += u * group
        if us.name in ("embeddings", "head"):
            root += u * group
        else:
            largest = max(largest, u * group)
    chunks = None
    if n <= 64 and ep == 1:
        all_counts = h.shape_counts()
        chunks = tuple(
            sum(c * dim0_chunk_numel(s, n, i) for s, c in all_counts.items()) for i in range(n)
        )
    return _StageNumbers(
        params=shard, grads=shard, optim=shard, largest_unit=max(largest, root),
        largest_block=largest, root=root, unsharded=unsharded, held=held,
        matmul=matmul, head=head, chunks=chunks, **mm,
    )  # fmt: skip


def predict(
    spec: ModelSpec,
    *,
    strategy: str = "ddp",
    topology: Topology | None = None,
    micro_batch: int = 1,
    seq_len: int | None = None,
    dtype: str | DtypePolicy = "bf16-mixed",
    optimizer: str = "adamw",
    recompute: str = "none",
    pp_schedule: str = "1f1b",
    microbatches: int = 1,
    virtual_stages: int = 1,
    sp: bool = False,
    sp_saves_gathered: bool = False,
    sp_gather: str = "shared",
    shard_size: int | None = None,
    offload: str = "none",
    flash: bool = True,
    kv_repeat: bool = True,
    norm_kernel: str = "fused",
    bucket_view: bool = False,
    ddp_old_buckets: bool = False,
    ddp_one_rank: bool = False,
    ddp_rebuild: bool = False,
    loss_parallel: bool = False,
    vocab_parallel: bool = True,
    kv_replicate: bool = True,
    logits_held: bool = False,
    reshard_after_forward: bool = True,
    overhead_bytes: int = 0,
) -> Ledger:
    """The per-rank memory ledger of one training step (see the module docstring).

    ``micro_batch`` sequences of ``seq_len`` tokens per rank per micro-batch; ``microbatches``
    micro-batches per step (pipeline micro-batches, or gradient accumulation without PP).
    ``sp_gather`` (``activations.SP_GATHERS``, with ``sp`` and ``sp_saves_gathered``): whether
    the linears behind each all-gather share one saved gathered input (``shared``) or save a
    copy each (``per-linear``: parlab's SP before commit 02e7fd8; at micro-batch 1 they share
    it all the same, the strided view being contiguous then).
    """
    topo = topology or Topology(world_size=1)
    seq_len = seq_len or spec.max_seq_len
    _positive(micro_batch=micro_batch, seq_len=seq_len, microbatches=microbatches)
    _positive(virtual_stages=virtual_stages)
    if overhead_bytes < 0:
        raise UsageError(f"overhead_bytes = {overhead_bytes}: give 0 or more")
    if recompute not in act.RECOMPUTE:
        raise UsageError(f"recompute = {recompute!r}: use one of {', '.join(act.RECOMPUTE)}")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"optimizer = {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if offload not in OFFLOADS:
        raise UsageError(f"offload = {offload!r}: use one of {', '.join(OFFLOADS)}")
    if seq_len % topo.cp:
        raise UsageError(f"seq_len = {seq_len} is not divisible by cp = {topo.cp}")
    if sp_gather not in act.SP_GATHERS:
        raise UsageError(f"sp_gather = {sp_gather!r}: use one of {', '.join(act.SP_GATHERS)}")
    if sp_gather == "per-linear" and not (sp and sp_saves_gathered):
        raise UsageError(
            "sp_gather = 'per-linear' is parlab's sequence parallelism saving the gathered input: "
            "give sp=True and sp_saves_gathered=True"
        )
    if norm_kernel == "compiled" and recompute == "op-selective":
        raise UsageError(
            "norm_kernel = 'compiled' with op-level selective recompute is not modelled (the "
            "checkpoint's policy and the compiled partition both choose what is kept)"
        )
    pp_schedule = act.schedule_name(pp_schedule)
    if pp_schedule == "zbv" and (virtual_stages != 2 or topo.pp < 2):
        raise UsageError("pp_schedule = 'zbv' needs pp > 1 and virtual_stages = 2 (the V)")
    if virtual_stages > 1 and pp_schedule not in ("interleaved", "zbv"):
        raise UsageError("virtual_stages > 1 needs pp_schedule = 'interleaved'")
    v_shape = pp_schedule == "zbv"  # rank 0 holds the first and the last chunk, and the loss
    if loss_parallel and not vocab_parallel:
        raise UsageError(
            "loss_parallel needs vocab_parallel (the output layer split over the vocabulary)"
        )
    pol = dtype_policy(dtype)
    n = check_layout(
        spec, topo, strategy=strategy, shard_size=shard_size, virtual_stages=virtual_stages,
        kv_replicate=kv_replicate,
    )  # fmt: skip
    n_states, foreach_temp = OPTIMIZERS[optimizer]
    tp, pp, ep = topo.tp, topo.pp, topo.ep
    e, r = pol.compute_bytes, pol.residual_bytes
    autocast = runs_autocast(pol, strategy)
    if pol.autocast and not autocast:
        r = e  # the whole forward in the compute dtype, like pure low precision
    tokens = micro_batch * seq_len // topo.cp  # local tokens per micro-batch
    accumulate = microbatches > 1 or pp > 1
    # per-linear copies only where the gathered view is strided: tp > 1, micro-batch > 1
    gather = sp_gather if tp > 1 and micro_batch > 1 else "shared"

    # per-layer activation bytes per token (two kinds of block at most: dense, MoE)
    kinds: dict[bool, tuple[float, float]] = {}

    def per_token(ts: list[act.ActTerm], mode: str) -> float:
        return act.layer_bytes_per_token(
            ts, tp=tp, sp=sp, recompute=mode, r=r, hidden=spec.hidden,
            sp_saves_gathered=sp_saves_gathered, sp_gather=gather,
        )  # fmt: skip

    def layer_bytes(i: int) -> tuple[float, float]:
        k = spec.is_moe_layer(i)
        if k not in kinds:
            terms = act.layer_terms(
                spec, i, seq_len=seq_len, r=r, e=e, autocast=autocast, flash=flash,
                kv_repeat=kv_repeat, norm_kernel=norm_kernel,
            )  # fmt: skip
            full = per_token(terms, "none")
            if recompute == "op-selective":
                kept = per_token(act.op_saved_terms(spec, i, r=r, e=e), "none")
            else:
                kept = per_token(terms, recompute)
            kinds[k] = (kept, full)
        return kinds[k]

    items: dict[str, list[int]] = {}
    detail: dict[str, list[tuple[int, ...]]] = {}
    peaks: list[int] = []
    phases: list[str] = []
    for stage in range(pp):
        sn = _stage_numbers(
            spec, tp, pp, ep, stage, virtual_stages, strategy, n, vocab_parallel, v_shape
        )
        p_el, g_el, o_el = sn.params, sn.grads, sn.optim
        largest_unit, root_el = sn.largest_unit, sn.root
        row: dict[str, int] = {}
        row["params"] = p_el * pol.param_bytes
        if strategy == "fsdp" and pp > 1 and not reshard_after_forward:
            # torch's pipelining keeps FSDP's gradients unreduced (unsharded) until the last
            # micro-batch's backward, beside the gathered parameters
            g_el = sn.unsharded
        row["grads"] = g_el * pol.grad_bytes
        row["optimizer"] = n_states * o_el * pol.state_bytes
        row["master_params"] = o_el * pol.master_bytes
        # the fp32 copy of the reduced gradient the optimizer steps the master with (from the
        # end of backward to zero_grad: the optimizer phase)
        row["master_grads"] = o_el * pol.master_bytes
        # DDP replicates over dp x cp (context-parallel ranks average their gradients too); on
        # one rank only where torch DDP wraps the model all the same (ddp_one_rank)
        ddp = strategy == "ddp" and (topo.dp * topo.cp > 1 or ddp_one_rank)
        row["ddp_buckets"] = sn.held * pol.grad_bytes if ddp and not bucket_view else 0
        # torch DDP over NCCL: the first iteration's buckets outlive the bucket rebuild until
        # the second iteration's first all-reduce (module docstring); forward/backward only
        row["ddp_old_buckets"] = (
            sn.held * pol.grad_bytes
            if strategy == "ddp" and topo.dp * topo.cp > 1 and ddp_old_buckets
            else 0
        )
        # torch DDP's one bucket rebuild, before its second forward: the new buckets beside the
        # old, whose gradients they copy (module docstring)
        row["ddp_rebuild"] = sn.held * pol.grad_bytes if ddp and ddp_rebuild else 0
        # activations
        layer_ids = _stage_layer_ids(spec, pp, stage, virtual_stages, v_shape)
        flight = act.in_flight(pp_schedule, pp, stage, microbatches, virtual_stages)
        # micro-batches whose loss graph is alive at once on the last stage: GPipe's every one
        loss_flight = microbatches if pp_schedule == "gpipe" else 1
        by_kind = _layer_kinds(spec, tuple(layer_ids))  # one layer of each kind for all
        kept = sum(layer_bytes(i)[0] * n for i, n in by_kind)
        last = stage == (0 if v_shape else pp - 1)  # the rank that computes the loss
        head = (
            act.head_bytes_per_token(
                spec,
                r=r,
                e=e,
                autocast=autocast,
                tp=tp,
                sp=sp,
                # torch.compile compiles the blocks: the final norm runs eager (on CUDA fused)
                norm_kernel="fused" if norm_kernel == "compiled" else norm_kernel,
                sp_saves_gathered=sp_saves_gathered,
            )
            if last
            else 0.0
        )
        row["activations"] = round(flight * (kept + head) * tokens)
        full_max = max((layer_bytes(i)[1] for i, _ in by_kind), default=0.0)
        if recompute == "full":
            row["recompute_buffer"] = round(full_max * tokens)
        elif recompute == "op-selective":  # one block's recomputed tensors, in its backward
            kept_max = max((layer_bytes(i)[0] for i, _ in by_kind), default=0.0)
            row["recompute_buffer"] = round(max(0.0, full_max - kept_max) * tokens)
        else:
            row["recompute_buffer"] = 0
        vocab_local = spec.vocab_size // (tp if loss_parallel else 1)
        row["logits"] = tokens * vocab_local * 4 if last else 0
        # log-probs + their gradient; parlab's vocab-parallel cross-entropy: its saved softmax,
        # and in backward the one-hot target and its masked copy beside the new gradient
        row["loss_buffers"] = (3 if loss_parallel and tp > 1 else 2) * tokens * vocab_local * 4
        row["loss_buffers"] *= int(last)
        # each micro-batch's loss is computed at the end of its forward: the loss of every
        # other micro-batch in flight keeps its log-probs (softmax) until its backward
        row["pending_loss_buffers"] = (loss_flight - 1) * tokens * vocab_local * 4 if last else 0
        row["held_logits"] = tokens * vocab_local * e if last and logits_held else 0
        ffn = _ffn_width(spec, layer_ids)
        row["backward_transient"] = tokens * (2 * ffn // tp + 2 * spec.hidden) * e
        matmul = sn.matmul
        row["autocast_weight_copies"] = (
            matmul * 2
            if pol.autocast and strategy in ("ddp", "zero1", "zero2") and pol.param_bytes == 4
            else 0
        )
        gather_b = e if pol.param_bytes > e else pol.param_bytes
        if strategy == "zero3":  # the unit in use (at the loss: the head) + the prefetched block
            row["gather_buffers"] = (largest_unit + sn.largest_block) * gather_b
        elif strategy in ("fsdp", "fsdp-hybrid") and not reshard_after_forward:
            row["gather_buffers"] = sn.unsharded * gather_b  # every unit stays gathered
        elif strategy in ("fsdp", "fsdp-hybrid"):  # the root unit, kept, + the prefetched block
            row["gather_buffers"] = (root_el + sn.largest_block) * gather_b
        else:
            row["gather_buffers"] = 0
        if strategy in ("zero2", "zero3"):
            # parlab's ZeRO-2/3 flatten a unit's gradients as soon as they are ready: at the top
            # of backward, where the activations peak, the first is the last stage's head unit
            # (final norm and output projection), a block's on any other stage
            first = math.ceil(sn.head / n) * n if last and sn.head else sn.largest_block
            row["reduce_buffers"] = first * pol.grad_bytes
        elif strategy in ("fsdp", "fsdp-hybrid"):
            row["reduce_buffers"] = largest_unit * pol.grad_bytes
        else:
            row["reduce_buffers"] = 0
        row["optimizer_temporaries"] = (
            o_el * pol.state_bytes if foreach_temp and n_states and offload == "none" else 0
        )
        row["allocator_overhead"] = overhead_bytes
        # host / device
        host = _offloaded(offload)
        dev = {k: (0 if k in host else v) for k, v in row.items()}
        # gradients that live in persistent buffers: DDP's buckets with bucket_view (the grads
        # are views of them, zeroed not freed) and ZeRO-1's full flat gradient buffers
        grads_resident = (ddp and bucket_view) or strategy == "zero1"
        resident = sum(
            dev[k]
            for k in ("params", "optimizer", "master_params", "ddp_buckets", "allocator_overhead")
        ) + (dev["grads"] if grads_resident else 0)
        base = sum(
            dev[k]
            for k in (
                "activations", "recompute_buffer", "autocast_weight_copies", "gather_buffers",
                "held_logits", "ddp_old_buckets", "pending_loss_buffers",
            )
        )  # fmt: skip
        # the recomputed tensors of one block live in that block's backward, after the loss
        # region is gone (op-selective: its unsaved part; full: the block's every activation)
        late = dev["recompute_buffer"] if recompute in ("op-selective", "full") else 0
        base -= late
        # the output unit's gradients, whole until reduced (none new when grads are resident)
        head_grads = sn.head * pol.grad_bytes if last and not grads_resident else 0
        grads_fb = dev["grads"] if accumulate and not grads_resident else 0
        if pp_schedule == "gpipe" and accumulate and not grads_resident:
            # every forward before any backward, and the step starts without gradients
            # (zero_grad(set_to_none)): the peak is at the start of the first backward (no
            # gradients yet) or at its end (every gradient, one micro-batch's activations
            # freed), whichever is higher
            grads_fb = max(0, dev["grads"] - round(dev["activations"] / flight))
        # the loss region (logits, log-probs and their gradients) is gone before the first
        # block's backward needs its activation gradients and the output layer's grads
        fb = (
            base
            + grads_fb
            + max(
                dev["logits"] + dev["loss_buffers"],
                dev["backward_transient"] + head_grads + dev["reduce_buffers"] + late,
            )
        )
        if recompute == "full" and dev["autocast_weight_copies"]:
            # full recompute saves no block's bf16 weight copies: autocast's cache holds them
            # until the loss is computed, and each block's recompute casts its own again. The
            # end of forward (every copy, the fp32 logits and their log-probs, no recompute
            # buffer yet) or backward (one block's copies), whichever is higher
            blocks = (sn.blocks_matmul - sn.block_matmul) * 2
            fb_end = base + grads_fb + 2 * dev["logits"]  # the log-probs: the logits' size
            fb = max(fb - blocks, fb_end)
        opt = (
            (0 if grads_resident else dev["grads"])
            + dev["optimizer_temporaries"]
            + dev["master_grads"]
        )
        rebuild = dev["ddp_rebuild"]  # states only: no activations or gradients in flight
        # FSDP's end of backward: every sharded gradient, the root's reduce-scatter input
        eob = (
            dev["grads"] + dev["reduce_buffers"]
            if strategy in ("fsdp", "fsdp-hybrid") and not grads_resident
            else 0
        )
        peaks.append(resident + max(fb, opt, rebuild, eob))
        phases.append(
            "ddp-bucket-rebuild"
            if rebuild > max(fb, opt, eob)
            else "forward-backward"
            if fb >= max(opt, eob)
            else "end-of-backward"
            if eob > opt
            else "optimizer-step"
        )
        for k, v in row.items():
            items.setdefault(k, []).append(v)
        if sn.chunks is not None:
            chunks = sn.chunks
            detail.setdefault("optimizer", []).append(
                tuple(n_states * c * pol.state_bytes for c in chunks)
            )
            if pol.master_bytes:
                for k in ("master_params", "master_grads"):
                    detail.setdefault(k, []).append(tuple(c * pol.master_bytes for c in chunks))

    host = _offloaded(offload)
    ledger_items = tuple(
        LedgerItem(
            name=k,
            per_stage=tuple(v),
            kind=_KIND[k],
            formula=_FORMULA[k],
            on_device=k not in host,
        )
        for k, v in items.items()
        if any(v) or k in ("params", "grads", "optimizer", "activations")
    )
    notes = [
        f"shard count N = {n}" + (f" (experts over N/ep = {max(1, n // ep)})" if ep > 1 else ""),
        f"gradients alive at the start of backward: {'all (accumulating)' if accumulate else 'output layer only'}",
    ]
    if not flash:
        notes.append("math attention: s x s scores kept per layer")
    knobs = dict(
        micro_batch=micro_batch, seq_len=seq_len, microbatches=microbatches, dtype=pol.name,
        optimizer=optimizer, recompute=recompute, pp_schedule=pp_schedule,
        virtual_stages=virtual_stages, sp=sp, sp_saves_gathered=sp_saves_gathered,
        sp_gather=sp_gather, shard_size=shard_size, offload=offload,
        flash=flash, kv_repeat=kv_repeat, norm_kernel=norm_kernel, bucket_view=bucket_view,
        ddp_old_buckets=ddp_old_buckets, ddp_one_rank=ddp_one_rank, ddp_rebuild=ddp_rebuild,
        loss_parallel=loss_parallel,
        vocab_parallel=vocab_parallel, logits_held=logits_held,
        reshard_after_forward=reshard_after_forward,
        overhead_bytes=overhead_bytes,
    )  # fmt: skip
    return Ledger(
        model=spec.name,
        strategy=strategy,
        topology=topo,
        knobs=knobs,
        items=ledger_items,
        peak_per_stage=tuple(peaks),
        peak_phase=tuple(phases),
        notes=tuple(notes),
        shard_detail={k: tuple(v) for k, v in detail.items()},
        shard_count=n,
    )


@lru_cache(maxsize=65536)
def _layer_kinds(spec: ModelSpec, layer_ids: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(a representative layer, how many) of each kind of block (dense, MoE) in ``layer_ids``:
    blocks of one kind keep the same bytes."""
    groups: dict[bool, list[int]] = {}
    for i in layer_ids:
        groups.setdefault(spec.is_moe_layer(i), []).append(i)
    return tuple((ids[0], len(ids)) for ids in groups.values())


def _offloaded(offload: str) -> set[str]:
    if offload == "optimizer":
        return {"optimizer", "master_params", "master_grads", "optimizer_temporaries"}
    if offload == "params":
        return {
            "params", "grads", "optimizer", "master_params", "master_grads",
            "optimizer_temporaries",
        }  # fmt: skip
    return set()


def _stage_layer_ids(
    spec: ModelSpec, pp: int, stage: int, virtual: int, v_shape: bool = False
) -> list[int]:
    from parlab.ledger.sharding import stage_layers

    return stage_layers(spec.layers, pp, stage, virtual, v_shape=v_shape)


def _ffn_width(spec: ModelSpec, layer_ids: list[int]) -> int:
    width = 0
    for i in layer_ids[:1] + layer_ids[-1:]:
        if spec.is_moe_layer(i):
            m = spec.moe
            assert m is not None
            width = max(width, m.top_k * m.expert_ffn_hidden + m.shared_hidden)
        else:
            width = max(width, spec.ffn_hidden)
    return width


_KIND = {
    "params": "state",
    "grads": "state",
    "optimizer": "state",
    "master_params": "state",
    "ddp_buckets": "buffer",
    "ddp_old_buckets": "buffer",
    "ddp_rebuild": "buffer",
    "activations": "transient",
    "recompute_buffer": "transient",
    "logits": "transient",
    "loss_buffers": "transient",
    "held_logits": "transient",
    "pending_loss_buffers": "transient",
    "backward_transient": "transient",
    "autocast_weight_copies": "transient",
    "gather_buffers": "buffer",
    "reduce_buffers": "buffer",
    "optimizer_temporaries": "optimizer-step",
    "master_grads": "optimizer-step",
    "allocator_overhead": "overhead",
}

_FORMULA = {
    "params": "held parameter elements x param bytes (ZeRO: padded flat units; FSDP: dim-0 shards)",
    "grads": "gradient elements x grad bytes (zero1: full flat; zero2/3, fsdp: shards)",
    "optimizer": "optimizer states per element x state bytes, on what the optimizer steps",
    "master_params": "fp32 master copy of what the optimizer steps (bf16-params)",
    "master_grads": "fp32 copy of the reduced gradient the master is stepped with (bf16-params)",
    "ddp_buckets": "DDP gradient buckets (dp > 1): a copy of every gradient (bucket_view=False)",
    "ddp_old_buckets": "torch DDP over NCCL: first-iteration buckets held by the process group "
    "through the second iteration's forward/backward (P x grad bytes)",
    "ddp_rebuild": "torch DDP's bucket rebuild before its second forward: new buckets beside "
    "the old (P x grad bytes, over the resident states alone)",
    "activations": "micro-batches in flight x sum over stage layers of bytes/token x tokens",
    "recompute_buffer": "full recompute: one layer's activations during its backward "
    "(op-selective: its recomputed, unsaved part)",
    "logits": "float32 logits for the loss (a cast copy under bf16), tokens x vocab x 4",
    "loss_buffers": "cross-entropy: float32 log-probs + their gradient, 2 x tokens x vocab x 4",
    "held_logits": "the model's output logits, kept by the training loop through backward",
    "pending_loss_buffers": "loss computed in each micro-batch's forward: the float32 log-probs "
    "(softmax) of the other micro-batches in flight on the last stage, (m - 1) x tokens x vocab x 4",
    "backward_transient": "one block's activation gradients: tokens x (2 f / tp + 2 h) x compute bytes",
    "autocast_weight_copies": "bf16 copies of fp32 matmul weights kept for backward (autocast)",
    "gather_buffers": "unsharded params in the gather dtype: the unit in use (FSDP: the kept root) + one prefetched block",
    "reduce_buffers": "one unit's unsharded gradients before their reduce-scatter (in backward)",
    "optimizer_temporaries": "foreach AdamW: one state-sized temporary (sqrt of exp_avg_sq)",
    "allocator_overhead": "explicit, settable allocator/framework overhead",
}


def kv_cache_bytes(
    spec: ModelSpec, *, batch: int, seq_len: int, dtype_bytes: int = 2, tp: int = 1, pp: int = 1
) -> int:
    """KV cache of ``batch`` sequences of ``seq_len`` tokens on one rank.

    MHA/GQA: ``2 x layers/pp x batch x seq x kv_dim/tp x bytes`` (a KV head is never split:
    with fewer KV heads than TP ranks each rank keeps one). MLA: the latent
    ``kv_lora_rank + qk_rope_head_dim`` per token and layer, replicated over TP.
    """
    _positive(batch=batch, seq_len=seq_len, tp=tp, pp=pp)
    layers = spec.layers // pp
    if spec.mla is not None:
        per_tok = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    else:
        heads_local = max(1, spec.n_kv_heads // tp)
        per_tok = 2 * heads_local * spec.d_head
    return layers * batch * seq_len * per_tok * dtype_bytes


def predict_inference(
    spec: ModelSpec,
    *,
    topology: Topology | None = None,
    batch: int = 1,
    seq_len: int | None = None,
    dtype_bytes: int = 2,
    kv_dtype_bytes: int | None = None,
    overhead_bytes: int = 0,
) -> Ledger:
    """Per-rank memory of serving ``batch`` sequences of up to ``seq_len`` tokens (TP/PP only).

    Items: ``params`` (held weights in ``dtype_bytes``), ``kv_cache``, ``prefill_transient``
    (one block's intermediates for a whole ``seq_len`` prefill of one sequence, plus its
    last-position logits for the batch), ``allocator_overhead``.
    """
    topo = topology or Topology(world_size=1)
    seq_len = seq_len or spec.max_seq_len
    check_tp(spec, topo.tp)
    check_pp(spec, topo.pp)
    check_ep(spec, topo.ep)
    kvb = kv_dtype_bytes or dtype_bytes
    rows: dict[str, list[int]] = {
        "params": [],
        "kv_cache": [],
        "prefill_transient": [],
        "allocator_overhead": [],
    }
    for stage in range(topo.pp):
        h = holding(spec, tp=topo.tp, pp=topo.pp, ep=topo.ep, stage=stage)
        rows["params"].append(h.numel * dtype_bytes)
        rows["kv_cache"].append(
            kv_cache_bytes(
                spec, batch=batch, seq_len=seq_len, dtype_bytes=kvb, tp=topo.tp, pp=topo.pp
            )
        )
        ffn = _ffn_width(spec, list(range(spec.layers)))
        trans = seq_len * (2 * ffn // topo.tp + 4 * spec.hidden) * dtype_bytes
        if stage == topo.pp - 1:
            trans += batch * spec.vocab_size * 4
        rows["prefill_transient"].append(trans)
        rows["allocator_overhead"].append(overhead_bytes)
    items = tuple(
        LedgerItem(
            name=k,
            per_stage=tuple(v),
            kind={"params": "state", "kv_cache": "state", "prefill_transient": "transient"}.get(
                k, "overhead"
            ),
            formula={
                "params": "held weights x dtype bytes",
                "kv_cache": "layers x batch x seq x (K+V per token) x bytes",
                "prefill_transient": "one block's intermediates for a seq_len prefill + logits",
                "allocator_overhead": "explicit, settable allocator/framework overhead",
            }[k],
        )
        for k, v in rows.items()
    )
    peaks = tuple(sum(v[s] for v in rows.values()) for s in range(topo.pp))
    return Ledger(
        model=spec.name,
        strategy="inference",
        topology=topo,
        knobs=dict(batch=batch, seq_len=seq_len, dtype_bytes=dtype_bytes, kv_dtype_bytes=kvb),
        items=items,
        peak_per_stage=peaks,
        peak_phase=("decode",) * topo.pp,
    )
