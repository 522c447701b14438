"""Compose the parallelisms on one device mesh, in one fixed order (torchtitan's ``parallelize_llama``).

Pipeline parallelism comes first and is not here: it decides *which* model a
rank builds (``pipeline.build_stage``); everything below is applied to that
stage. What crosses the wire is documented by each mechanism's module; this
function only decides the order and which sub-mesh each one gets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from parlab.errors import UsageError

DATA_PARALLEL = ("none", "ddp", "fsdp")


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """The knobs of ``parallelize``: what ``parlab plan`` hands over."""

    sequence_parallel: bool = False
    """With TP: all-gather/reduce-scatter around the norms instead of all-reduce."""
    loss_parallel: bool = False
    """With TP: cross-entropy on vocab-sharded logits (no logits all-gather)."""
    cp_variant: str = "ring"
    """With CP: ``ring`` (send/recv K/V blocks) or ``allgather`` (all-gather K/V)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward."""
    compile: bool = False
    """``torch.compile`` each block."""
    data_parallel: str = "none"
    """Over the dp (x cp) ranks: ``none``, ``ddp`` or ``fsdp``."""
    param_dtype: str | None = None
    """FSDP mixed precision: compute dtype of the gathered parameters (``bfloat16``)."""
    reduce_dtype: str | None = None
    """FSDP mixed precision: dtype of the gradient reduce-scatter (``float32``)."""

    def __post_init__(self) -> None:
        if self.data_parallel not in DATA_PARALLEL:
            raise UsageError(
                f"data_parallel {self.data_parallel!r}: use one of {', '.join(DATA_PARALLEL)}"
            )
        if self.cp_variant not in ("ring", "allgather"):
            raise UsageError(f"cp_variant {self.cp_variant!r}: use ring or allgather")


def _sub(mesh: Any, name: str) -> Any | None:
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh[name] if name in names and mesh[name].size() > 1 else None


def replicate_mesh(mesh: Any) -> Any | None:
    """The ranks that hold the same parameters and reduce gradients: dp, cp, or both flattened."""
    dp, cp = _sub(mesh, "dp"), _sub(mesh, "cp")
    if dp is not None and cp is not None:
        return mesh["dp", "cp"]._flatten("dp_cp")
    return dp or cp


def parallelize(model: nn.Module, mesh: Any, plan: ParallelPlan) -> nn.Module:
    """Apply TP -> CP -> activation checkpointing -> compile -> FSDP/DDP to ``model`` (a stage)."""
    blocks = list(model.layers)

    # 1. TP first: it replaces the linears and embeddings by their shards. Every
    #    later step must see the sharded modules: checkpointing must replay the
    #    TP collectives on recompute, and FSDP must shard the TP-local tensors
    #    (sharding first and then cutting heads would cut across FSDP's shards).
    if (tp := _sub(mesh, "tp")) is not None:
        from parlab.parallel.tensor import apply_tensor_parallel

        apply_tensor_parallel(
            model,
            tp.get_group(),
            sequence_parallel=plan.sequence_parallel,
            loss_parallel=plan.loss_parallel,
        )

    # 2. CP swaps the attention kernel only (no parameter changes): before
    #    checkpointing so the recompute runs the ring too.
    if (cp := _sub(mesh, "cp")) is not None:
        from parlab.parallel.context import apply_context_parallel

        apply_context_parallel(model, cp.get_group(), variant=plan.cp_variant)

    # 3. Activation checkpointing per block, around the already-sharded block, so
    #    only the block input (S/t tokens with SP) is kept and the backward
    #    recomputes the rest, collectives included. Parameter names do not change.
    if plan.activation_checkpointing:
        for block in blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)

    # 4. Compile per block after checkpointing (so the compiled graph contains the
    #    recompute boundary) and before FSDP (so FSDP's all-gather/reduce-scatter
    #    hooks stay outside the graphs and can overlap with them).
    if plan.compile:
        for block in blocks:
            block.compile()

    # 5. Data parallelism last, over the ranks that hold the same parameters (dp,
    #    and cp: CP ranks hold the same weights and see different tokens). It wraps
    #    whatever the steps above produced; FSDP per block, then the root.
    rep = replicate_mesh(mesh)
    if rep is None or plan.data_parallel == "none":
        return model
    if plan.data_parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(
            param_dtype=getattr(torch, plan.param_dtype) if plan.param_dtype else None,
            reduce_dtype=getattr(torch, plan.reduce_dtype) if plan.reduce_dtype else None,
        )
        for block in blocks:
            fully_shard(block, mesh=rep, mp_policy=mp)
        fully_shard(model, mesh=rep, mp_policy=mp)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    return DDP(model, process_group=rep.get_group(), device_ids=device_ids)
