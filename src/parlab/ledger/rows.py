"""One pipeline stage's row of the ledger: every item's bytes on a rank of that stage
(``stage_row``) and the stage's peak with its phase (``stage_peak``), from the inputs of one
``predict`` call (``Step``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from parlab.ledger import activations as act
from parlab.ledger.implementation import Implementation
from parlab.ledger.policy import OPTIMIZERS, DtypePolicy, runs_autocast
from parlab.ledger.stages import (
    StageNumbers,
    ffn_width,
    layer_kinds,
    offloaded,
    stage_layer_ids,
)
from parlab.models.spec import ModelSpec
from parlab.topology import Topology

FSDP = ("fsdp", "fsdp-hybrid")


@dataclass(frozen=True, kw_only=True)
class Step:
    """What every stage of one ``predict`` call shares: its inputs and what follows from them."""

    spec: ModelSpec
    topo: Topology
    strategy: str
    impl: Implementation
    pol: DtypePolicy
    n: int
    """The shard count."""
    micro_batch: int
    seq_len: int
    microbatches: int
    virtual_stages: int
    pp_schedule: str
    optimizer: str
    recompute: str
    sp: bool
    offload: str
    reshard_after_forward: bool
    overhead_bytes: int
    shard_size: int | None
    kinds: dict[bool, tuple[float, float]] = field(default_factory=dict)
    """Per-token activation bytes (kept, whole) of each kind of block (dense, MoE), filled
    lazily: blocks of one kind keep the same bytes."""

    @property
    def n_states(self) -> int:
        return OPTIMIZERS[self.optimizer][0]

    @property
    def autocast(self) -> bool:
        return runs_autocast(self.pol, self.strategy)

    @property
    def e(self) -> int:
        return self.pol.compute_bytes

    @property
    def r(self) -> int:
        # gathered in the compute dtype under autocast: the whole forward in it
        return self.e if self.pol.autocast and not self.autocast else self.pol.residual_bytes

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len // self.topo.cp  # local tokens per micro-batch

    @property
    def accumulate(self) -> bool:
        return self.microbatches > 1 or self.topo.pp > 1

    @property
    def v_shape(self) -> bool:
        return self.pp_schedule == "zbv"  # rank 0 holds the first and the last chunk, and the loss

    @property
    def ddp(self) -> bool:
        """torch DDP wraps the model: over dp x cp > 1 (context-parallel ranks average their
        gradients too), or on one rank where the implementation says so."""
        topo = self.topo
        return self.strategy == "ddp" and (topo.dp * topo.cp > 1 or self.impl.ddp_one_rank)

    @property
    def grads_resident(self) -> bool:
        """Gradients live in persistent buffers: DDP's buckets with bucket_view (the grads are
        views of them, zeroed not freed) and ZeRO-1's full flat gradient buffers."""
        return (self.ddp and self.impl.bucket_view) or self.strategy == "zero1"


def _layer_bytes(step: Step, i: int) -> tuple[float, float]:
    """Per-token activation bytes of layer ``i``: (kept under the recompute mode, whole)."""
    spec, impl, r, e = step.spec, step.impl, step.r, step.e
    kind = spec.is_moe_layer(i)
    if kind in step.kinds:
        return step.kinds[kind]
    tp = step.topo.tp
    # per-linear copies only where the gathered view is strided: tp > 1, micro-batch > 1
    gather = impl.sp_gather if tp > 1 and step.micro_batch > 1 else "shared"

    def per_token(ts: list[act.ActTerm], mode: str) -> float:
        return act.layer_bytes_per_token(
            ts, tp=tp, sp=step.sp, recompute=mode, r=r, hidden=spec.hidden,
            sp_saves_gathered=impl.sp_saves_gathered, sp_gather=gather,
        )  # fmt: skip

    terms = act.layer_terms(
        spec, i, seq_len=step.seq_len, r=r, e=e, autocast=step.autocast,
        flash=impl.attention_kernel == "flash", kv_repeat=impl.kv_repeat,
        norm_kernel=impl.norm_kernel,
    )  # fmt: skip
    full = per_token(terms, "none")
    if step.recompute == "op-selective":
        kept = per_token(act.op_saved_terms(spec, i, r=r, e=e), "none")
    else:
        kept = per_token(terms, step.recompute)
    step.kinds[kind] = (kept, full)
    return kept, full


def stage_row(step: Step, sn: StageNumbers, stage: int) -> tuple[dict[str, int], float, bool]:
    """Every item's bytes on a rank of ``stage`` (in ledger order), the micro-batches in flight
    there, and whether it computes the loss."""
    row = _state_items(step, sn)
    last = stage == (0 if step.v_shape else step.topo.pp - 1)  # the rank that computes the loss
    flight = act.in_flight(
        step.pp_schedule, step.topo.pp, stage, step.microbatches, step.virtual_stages
    )
    layer_ids = stage_layer_ids(step.spec, step.topo.pp, stage, step.virtual_stages, step.v_shape)
    row |= _activation_items(step, layer_ids, flight=flight, last=last)
    row |= _loss_items(step, sn, layer_ids, last=last)
    row |= _buffer_items(step, sn, last=last)
    return row, flight, last


def _state_items(step: Step, sn: StageNumbers) -> dict[str, int]:
    """Parameters, gradients, optimizer states, the master copy and DDP's buckets."""
    pol, impl, topo = step.pol, step.impl, step.topo
    g_el = sn.grads
    if step.strategy == "fsdp" and topo.pp > 1 and not step.reshard_after_forward:
        # torch's pipelining keeps FSDP's gradients unreduced (unsharded) until the last
        # micro-batch's backward, beside the gathered parameters
        g_el = sn.unsharded
    grad_copy = sn.held * pol.grad_bytes
    return {
        "params": sn.params * pol.param_bytes,
        "grads": g_el * pol.grad_bytes,
        "optimizer": step.n_states * sn.optim * pol.state_bytes,
        "master_params": sn.optim * pol.master_bytes,
        # the fp32 copy of the reduced gradient the optimizer steps the master with (from the
        # end of backward to zero_grad: the optimizer phase)
        "master_grads": sn.optim * pol.master_bytes,
        "ddp_buckets": grad_copy if step.ddp and not impl.bucket_view else 0,
        # the first iteration's buckets outlive the rebuild (forward/backward only)
        "ddp_old_buckets": (
            grad_copy
            if step.strategy == "ddp" and topo.dp * topo.cp > 1 and impl.ddp_old_buckets
            else 0
        ),
        # the one bucket rebuild before the second forward: the new buckets beside the old
        "ddp_rebuild": grad_copy if step.ddp and impl.ddp_rebuild else 0,
    }


def _activation_items(
    step: Step, layer_ids: list[int], *, flight: float, last: bool
) -> dict[str, int]:
    """The saved activations of the micro-batches in flight, and the recompute's buffer."""
    spec, impl, tokens = step.spec, step.impl, step.tokens
    by_kind = layer_kinds(spec, tuple(layer_ids))  # one layer of each kind for all
    kept = sum(_layer_bytes(step, i)[0] * count for i, count in by_kind)
    head = 0.0
    if last:
        head = act.head_bytes_per_token(
            spec, r=step.r, e=step.e, autocast=step.autocast, tp=step.topo.tp, sp=step.sp,
            # torch.compile compiles the blocks: the final norm runs eager (on CUDA fused)
            norm_kernel="fused" if impl.norm_kernel == "compiled" else impl.norm_kernel,
            sp_saves_gathered=impl.sp_saves_gathered,
        )  # fmt: skip
    full_max = max((_layer_bytes(step, i)[1] for i, _ in by_kind), default=0.0)
    if step.recompute == "full":
        buffer = round(full_max * tokens)
    elif step.recompute == "op-selective":  # one block's recomputed tensors, in its backward
        kept_max = max((_layer_bytes(step, i)[0] for i, _ in by_kind), default=0.0)
        buffer = round(max(0.0, full_max - kept_max) * tokens)
    else:
        buffer = 0
    return {"activations": round(flight * (kept + head) * tokens), "recompute_buffer": buffer}


def _loss_items(
    step: Step, sn: StageNumbers, layer_ids: list[int], *, last: bool
) -> dict[str, int]:
    """The loss region (logits, log-probs, held output), one block's activation gradients and
    autocast's weight copies."""
    spec, impl, pol, tokens, tp = step.spec, step.impl, step.pol, step.tokens, step.topo.tp
    vocab_local = spec.vocab_size // (tp if impl.loss_parallel else 1)
    vocab_f32 = tokens * vocab_local * 4 if last else 0
    # micro-batches whose loss graph is alive at once on the last stage: GPipe's every one
    loss_flight = step.microbatches if step.pp_schedule == "gpipe" else 1
    ffn = ffn_width(spec, layer_ids)
    weights_fp32 = pol.autocast and step.strategy in ("ddp", "zero1", "zero2")
    return {
        "logits": vocab_f32,
        # log-probs + their gradient; parlab's vocab-parallel cross-entropy: its saved softmax,
        # and in backward the one-hot target and its masked copy beside the new gradient
        "loss_buffers": (3 if impl.loss_parallel and tp > 1 else 2) * vocab_f32,
        # each micro-batch's loss is computed at the end of its forward: the loss of every
        # other micro-batch in flight keeps its log-probs (softmax) until its backward
        "pending_loss_buffers": (loss_flight - 1) * vocab_f32,
        "held_logits": tokens * vocab_local * step.e if last and impl.logits_held else 0,
        "backward_transient": tokens * (2 * ffn // tp + 2 * spec.hidden) * step.e,
        "autocast_weight_copies": sn.matmul * 2 if weights_fp32 and pol.param_bytes == 4 else 0,
    }


def _buffer_items(step: Step, sn: StageNumbers, *, last: bool) -> dict[str, int]:
    """ZeRO-3/FSDP's gather and reduce buffers, the optimizer's temporary, the overhead."""
    pol, strategy, n, e = step.pol, step.strategy, step.n, step.e
    gather_b = e if pol.param_bytes > e else pol.param_bytes
    if strategy == "zero3":  # the unit in use (at the loss: the head) + the prefetched block
        gather = (sn.largest_unit + sn.largest_block) * gather_b
    elif strategy in FSDP and not step.reshard_after_forward:
        gather = sn.unsharded * gather_b  # every unit stays gathered
    elif strategy in FSDP:  # the root unit, kept, + the prefetched block
        gather = (sn.root + sn.largest_block) * gather_b
    else:
        gather = 0
    if strategy in ("zero2", "zero3"):
        # parlab's ZeRO-2/3 flatten a unit's gradients as soon as they are ready: at the top
        # of backward, where the activations peak, the first is the last stage's head unit
        # (final norm and output projection), a block's on any other stage
        first = math.ceil(sn.head / n) * n if last and sn.head else sn.largest_block
        reduce = first * pol.grad_bytes
    elif strategy in FSDP:
        reduce = sn.largest_unit * pol.grad_bytes
    else:
        reduce = 0
    n_states, foreach_temp = OPTIMIZERS[step.optimizer]
    temp = foreach_temp and n_states and step.offload == "none"
    return {
        "gather_buffers": gather,
        "reduce_buffers": reduce,
        "optimizer_temporaries": sn.optim * pol.state_bytes if temp else 0,
        "allocator_overhead": step.overhead_bytes,
    }


def stage_peak(
    step: Step, sn: StageNumbers, row: dict[str, int], *, flight: float, last: bool
) -> tuple[int, str]:
    """The stage's peak device bytes and the phase it happens in (module docstring)."""
    host = offloaded(step.offload)
    dev = {k: (0 if k in host else v) for k, v in row.items()}
    resident_grads = step.grads_resident
    resident = sum(
        dev[k]
        for k in ("params", "optimizer", "master_params", "ddp_buckets", "allocator_overhead")
    ) + (dev["grads"] if resident_grads else 0)
    fb = _forward_backward(step, sn, dev, flight=flight, last=last)
    opt = (
        (0 if resident_grads else dev["grads"]) + dev["optimizer_temporaries"] + dev["master_grads"]
    )
    rebuild = dev["ddp_rebuild"]  # states only: no activations or gradients in flight
    # FSDP's end of backward: every sharded gradient, the root's reduce-scatter input
    eob = (
        dev["grads"] + dev["reduce_buffers"] if step.strategy in FSDP and not resident_grads else 0
    )
    phase = (
        "ddp-bucket-rebuild"
        if rebuild > max(fb, opt, eob)
        else "forward-backward"
        if fb >= max(opt, eob)
        else "end-of-backward"
        if eob > opt
        else "optimizer-step"
    )
    return resident + max(fb, opt, rebuild, eob), phase


def _forward_backward(
    step: Step, sn: StageNumbers, dev: dict[str, int], *, flight: float, last: bool
) -> int:
    """The forward/backward phase's bytes beyond the resident ones."""
    base = sum(
        dev[k]
        for k in (
            "activations", "recompute_buffer", "autocast_weight_copies", "gather_buffers",
            "held_logits", "ddp_old_buckets", "pending_loss_buffers",
        )
    )  # fmt: skip
    # the recomputed tensors of one block live in that block's backward, after the loss
    # region is gone (op-selective: its unsaved part; full: the block's every activation)
    late = dev["recompute_buffer"] if step.recompute in ("op-selective", "full") else 0
    base -= late
    resident_grads = step.grads_resident
    # the output unit's gradients, whole until reduced (none new when grads are resident)
    head_grads = sn.head * step.pol.grad_bytes if last and not resident_grads else 0
    grads_fb = dev["grads"] if step.accumulate and not resident_grads else 0
    if step.pp_schedule == "gpipe" and step.accumulate and not resident_grads:
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
    if step.recompute == "full" and dev["autocast_weight_copies"]:
        # full recompute saves no block's bf16 weight copies: autocast's cache holds them
        # until the loss is computed, and each block's recompute casts its own again. The
        # end of forward (every copy, the fp32 logits and their log-probs, no recompute
        # buffer yet) or backward (one block's copies), whichever is higher
        blocks = (sn.blocks_matmul - sn.block_matmul) * 2
        fb_end = base + grads_fb + 2 * dev["logits"]  # the log-probs: the logits' size
        fb = max(fb - blocks, fb_end)
    return fb
