"""``Implementation``: how a run's model and training loop are built, apart from its layout and
workload -- the kernels, what tensor and sequence parallelism keep, torch DDP's buckets, what
the loop holds. The ledger counts its bytes and the planner's roofline prices its time from it."""

from __future__ import annotations

from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.ledger.activations import NORM_KERNELS, SP_GATHERS

ATTENTION_KERNELS = ("flash", "math")
"""Attention core kernels: flash (causal half, never materialised) or materialised scores."""


@dataclass(frozen=True, kw_only=True)
class Implementation:
    """How the run's model and training loop are implemented (what its documents record)."""

    norm_kernel: str = "fused"
    """RMSNorm's kernel (``activations.NORM_KERNELS``: ``fused``, ``composite``, ``explicit``,
    ``compiled``)."""
    attention_kernel: str = "flash"
    """``flash`` (causal half, never materialised) or ``math`` (materialised scores)."""
    kv_repeat: bool = True
    """Grouped-query attention repeats K and V to every query head before the kernel (parlab's
    reference model); False: the kernel reads the KV heads as they are (flash attention's GQA,
    Transformer Engine)."""
    sp_saves_gathered: bool = False
    """Sequence parallelism saves the whole gathered sequence as the column-parallel linears'
    input (parlab's SP); False: ``S/t`` per rank, re-gathered in backward (Megatron's)."""
    sp_gather: str = "shared"
    """Whether the linears behind each all-gather share one saved gathered input or copy it each
    (``activations.SP_GATHERS``; ``per-linear``: parlab's SP before commit 02e7fd8, which the documents of
    its model-internal SP runs without ``sp_saved_input`` need)."""
    vocab_parallel: bool = True
    """Under TP the embeddings and the output layer split over the vocabulary; False: whole on
    every rank (torch's ``parallelize_module`` plan over the blocks)."""
    loss_parallel: bool = False
    """parlab's vocab-parallel cross-entropy over ``vocab / tp`` (needs ``vocab_parallel``)."""
    kv_replicate: bool = True
    """With fewer KV heads than TP ranks each rank keeps a whole KV head; False: refused."""
    bucket_view: bool = False
    """DDP's gradients are views of its buckets (``gradient_as_bucket_view``); False: the
    buckets are a second copy of every gradient."""
    ddp_one_rank: bool = False
    """torch DDP wraps the model on one data-parallel rank too (``parlab train --strategy ddp
    --nproc 1``): its buckets and their passes; else a ``ddp`` layout has them only where it has
    more than one data-parallel rank."""
    ddp_rebuild: bool = False
    """torch DDP rebuilds its buckets once, before the second forward: new buckets beside the old
    over the resident states alone (``ddp-bucket-rebuild``, where the states fill the GPU)."""
    ddp_old_buckets: bool = False
    """torch DDP over NCCL whose loop does not release the first step's buckets: they stay held by
    ProcessGroupNCCL through the second iteration's forward/backward, an upper bound (``parlab
    fit``; the documents of ``parlab train`` DDP runs before ``release_first_buckets``)."""
    logits_held: bool = False
    """The loop keeps the model's output (``tokens x vocab x e``) until backward ends (``parlab
    train``, the model-internal step without a schedule); torchtitan deletes it."""

    def __post_init__(self) -> None:
        if self.norm_kernel not in NORM_KERNELS:
            raise UsageError(
                f"norm kernel {self.norm_kernel!r}: use one of {', '.join(NORM_KERNELS)}"
            )
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise UsageError(
                f"attention kernel {self.attention_kernel!r}: use one of "
                f"{', '.join(ATTENTION_KERNELS)}"
            )
        if self.sp_gather not in SP_GATHERS:
            raise UsageError(f"sp_gather = {self.sp_gather!r}: use one of {', '.join(SP_GATHERS)}")
        if self.loss_parallel and not self.vocab_parallel:
            raise UsageError(
                "loss_parallel needs vocab_parallel (the output layer split over the vocabulary)"
            )
