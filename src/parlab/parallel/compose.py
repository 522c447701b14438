"""Compose the parallelisms on one device mesh, in one fixed order (torchtitan's ``parallelize_llama``).

``parallelize`` is the one path every project composes through, in this order:

1. tensor parallelism (TP, with sequence and loss parallelism);
2. context parallelism (CP: the attention kernel only);
3. activation checkpointing per block (``none``, ``selective``, ``full``);
4. ``torch.compile`` per block;
5. data parallelism: torch DDP or FSDP2 over the ranks that hold the same parameters, or the
   caller's own wrapper (``parlab train``'s strategies, which own the optimizer: DDP, FSDP2,
   parlab's ZeRO, DeepSpeed).

Why this order: TP replaces the linears by their shards, and every later step must see the
sharded modules (checkpointing replays the TP collectives on recompute; FSDP shards the
TP-local tensors). Checkpointing wraps the block's own forward, so the FSDP hooks stay
outside it (parameters are gathered once, not again for the recomputation). Compile sees the
checkpointed block, so the graph holds the recompute boundary, and runs before DDP/FSDP, so
their all-gather/reduce-scatter hooks stay outside the graphs and overlap with them. Data
parallelism goes last: it wraps whatever the steps above produced.

Pipeline parallelism comes first and is not here: it decides *which* model a rank builds
(``pipeline.build_stage``); everything above is applied to that stage. What crosses the wire
is documented by each mechanism's module; this one only decides the order and which sub-mesh
each step gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from parlab.errors import UsageError
from parlab.parallel.context import apply_context_parallel
from parlab.parallel.tensor import apply_tensor_parallel

DATA_PARALLEL = ("none", "ddp", "fsdp")
RECOMPUTE = ("none", "selective", "full")

# Ops whose outputs selective recomputation keeps (the expensive ones); the rest are recomputed.
_SAVE_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
}


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """The knobs of ``parallelize``: what ``parlab plan`` hands over."""

    sequence_parallel: bool = False
    """With TP: all-gather/reduce-scatter around the norms instead of all-reduce."""
    loss_parallel: bool = False
    """With TP: cross-entropy on vocab-sharded logits (no logits all-gather)."""
    cp_variant: str = "ring"
    """With CP: ``ring`` (send/recv K/V blocks) or ``allgather`` (all-gather K/V)."""
    recompute: str = "none"
    """Activation checkpointing per block: ``none``, ``selective`` (keep matmul and attention
    outputs, recompute the rest: torchtitan's op-level policy) or ``full`` (keep the block's
    input only)."""
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
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"--recompute {self.recompute!r} is not one of {', '.join(RECOMPUTE)}")


def _sub(mesh: Any, name: str) -> Any | None:
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh[name] if name in names and mesh[name].size() > 1 else None


def replicate_mesh(mesh: Any) -> Any | None:
    """The ranks that hold the same parameters and reduce gradients: dp, cp, or both flattened."""
    dp, cp = _sub(mesh, "dp"), _sub(mesh, "cp")
    if dp is not None and cp is not None:
        return mesh["dp", "cp"]._flatten("dp_cp")
    return dp or cp


def parallelize(
    model: nn.Module,
    mesh: Any | None,
    plan: ParallelPlan,
    *,
    data_parallel: Callable[[nn.Module], Any] | None = None,
) -> Any:
    """Apply TP -> CP -> activation checkpointing -> compile -> DDP/FSDP to ``model`` (a stage).

    ``mesh`` None: one group of data-parallel ranks, no TP or CP. ``data_parallel``: step 5 is
    the caller's wrapper (its return value is returned) instead of ``plan.data_parallel``."""
    if mesh is not None and (tp := _sub(mesh, "tp")) is not None:
        apply_tensor_parallel(
            model,
            tp.get_group(),
            sequence_parallel=plan.sequence_parallel,
            loss_parallel=plan.loss_parallel,
        )
    if mesh is not None and (cp := _sub(mesh, "cp")) is not None:
        apply_context_parallel(model, cp.get_group(), variant=plan.cp_variant)
    apply_recompute(model, plan.recompute)
    if plan.compile:
        apply_compile(model)
    if data_parallel is not None:
        return data_parallel(model)
    rep = replicate_mesh(mesh) if mesh is not None else None
    if rep is None or plan.data_parallel == "none":
        return model
    if plan.data_parallel == "fsdp":
        mp = MixedPrecisionPolicy(
            param_dtype=getattr(torch, plan.param_dtype) if plan.param_dtype else None,
            reduce_dtype=getattr(torch, plan.reduce_dtype) if plan.reduce_dtype else None,
        )
        for block in model.layers:  # type: ignore[union-attr]
            fully_shard(block, mesh=rep, mp_policy=mp)
        fully_shard(model, mesh=rep, mp_policy=mp)
        return model
    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    return DistributedDataParallel(model, process_group=rep.get_group(), device_ids=device_ids)


def _selective_policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    name = func._schema.name if hasattr(func, "_schema") else str(func)
    keep = name in _SAVE_OPS
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def apply_recompute(model: nn.Module, mode: str) -> None:
    """Step 3, activation checkpointing of every block: ``none``, ``selective`` (keep matmul
    and attention outputs, recompute the rest) or ``full`` (keep only the block's input).
    Parameter names do not change."""
    if mode not in RECOMPUTE:
        raise UsageError(f"--recompute {mode!r} is not one of {', '.join(RECOMPUTE)}")
    if mode == "none":
        return
    for block in model.layers:  # type: ignore[union-attr]
        inner = block.forward
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if mode == "selective":
            kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _selective_policy)

        def forward(*args: Any, _inner: Any = inner, _kw: dict[str, Any] = kwargs) -> Any:
            return checkpoint(_inner, *args, **_kw)

        block.forward = forward  # type: ignore[method-assign]


def apply_compile(model: nn.Module) -> None:
    """Step 4, ``torch.compile`` each block (after checkpointing, before DDP/FSDP)."""
    for block in model.layers:  # type: ignore[union-attr]
        block.compile()
