"""Tensor parallelism (Megatron-style) and sequence parallelism over one TP group.

What each rank holds (``t`` = TP degree): ``heads/t`` query heads and
``kv_heads/t`` KV heads (rows of wq, wk, wv; the matching columns of wo), ``ffn/t``
FFN columns (rows of w1 and w3, columns of w2), ``vocab/t`` rows of the
embedding and of the output projection. Norm weights are replicated.

What crosses the wire per transformer block, forward (the backward mirrors it;
payload ``B*S*H`` elements each; see ``tensor_comm``):

- plain TP: after wo and after w2, one all-reduce each (g); the input
  gradients of the attention and FFN blocks are all-reduced in backward (f);
- sequence parallel: those become one all-gather of the normed input
  (``B*S/t*H`` in, ``B*S*H`` out) before wq/wk/wv and before w1/w3, and one
  reduce-scatter after wo and after w2; norms and residuals run on ``S/t``
  tokens; norm-weight gradients are all-reduced once per use.

The embedding is vocab-parallel (each rank looks up its rows, zero elsewhere,
then all-reduce -- or reduce-scatter over the sequence with SP); the output
projection is column-parallel over the vocabulary, and with ``loss_parallel``
the cross-entropy runs on vocab-sharded logits (three all-reduces of ``B*S``
floats: max, sum of exp, target logit) instead of gathering ``B*S*V`` logits.

Entry point: ``apply_tensor_parallel(model, tp_group, sequence_parallel=,
loss_parallel=)`` on a torchtitan-named Llama model (``parlab.models``). Beside it,
``apply_torch_tensor_parallel``: torch's own DTensor plan for the same model, the reference
parlab's TP is measured against (plain TP: no SP, embeddings, output and logits whole).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from parlab.errors import UsageError
from parlab.parallel import tensor_comm as comm


def _rank_size(group: Any) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class ColumnParallelLinear(nn.Module):
    """``y_local = x @ W[rows of this rank].T``: output features split over the group.

    ``input_op``: ``copy`` (f: all-reduce of the input gradient), ``gather_seq``
    (SP: all-gather the sequence), or ``none`` (the caller already entered the
    TP region once for several linears, as ``TPEntry`` does).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        group: Any,
        *,
        bias: torch.Tensor | None = None,
        input_op: str = "copy",
        gather_output: bool = False,
    ) -> None:
        super().__init__()
        rank, size = _rank_size(group)
        out_features = weight.shape[0]
        if out_features % size:
            raise UsageError(f"{out_features} output features do not split over tp {size}")
        n = out_features // size
        rows = slice(rank * n, (rank + 1) * n)
        self.weight = nn.Parameter(weight.detach()[rows].clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach()[rows].clone())
        self.group = group
        self.input_op = input_op
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_op == "copy":
            x = comm.copy_to_tp(x, self.group)
        elif self.input_op == "gather_seq":
            x = comm.gather_seq(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return comm.gather_last(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = sum over ranks of x_local @ W[:, cols of this rank].T``: input features split.

    ``output_op``: ``reduce`` (g: all-reduce), ``reduce_scatter_seq`` (SP), or ``none``.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        group: Any,
        *,
        bias: torch.Tensor | None = None,
        output_op: str = "reduce",
    ) -> None:
        super().__init__()
        rank, size = _rank_size(group)
        in_features = weight.shape[1]
        if in_features % size:
            raise UsageError(f"{in_features} input features do not split over tp {size}")
        n = in_features // size
        self.weight = nn.Parameter(weight.detach()[:, rank * n : (rank + 1) * n].clone())
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.group = group
        self.output_op = output_op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.output_op == "reduce":
            y = comm.reduce_from_tp(y, self.group)
        elif self.output_op == "reduce_scatter_seq":
            y = comm.reduce_scatter_seq(y, self.group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, stop)`` of the embedding on this rank; other ids look up zero, then sum."""

    def __init__(self, weight: torch.Tensor, group: Any, *, sequence_parallel: bool = False):
        super().__init__()
        rank, size = _rank_size(group)
        vocab = weight.shape[0]
        if vocab % size:
            raise UsageError(f"vocab {vocab} does not split over tp {size}")
        n = vocab // size
        self.start, self.stop = rank * n, (rank + 1) * n
        self.weight = nn.Parameter(weight.detach()[self.start : self.stop].clone())
        self.group = group
        self.sequence_parallel = sequence_parallel

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.stop)
        local = (ids - self.start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return comm.reduce_scatter_seq(y, self.group)
        return comm.reduce_from_tp(y, self.group)


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, target: torch.Tensor, start: int, group: Any
    ) -> torch.Tensor:
        logits = logits.float()
        vmax = logits.max(dim=-1).values
        if dist.get_world_size(group) > 1:
            dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=group)
            comm._log("all_reduce", vmax)
        shifted = logits - vmax.unsqueeze(-1)
        n = logits.shape[-1]
        outside = (target < start) | (target >= start + n)
        local = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        picked = comm.all_reduce(picked, group)
        sum_exp = comm.all_reduce(sum_exp, group)
        loss = sum_exp.log() - picked
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, outside = ctx.saved_tensors
        grad = softmax
        onehot = torch.zeros_like(grad).scatter_(-1, local.unsqueeze(-1), 1.0)
        grad = grad - onehot * (~outside).unsqueeze(-1).to(grad.dtype)
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(
    logits_local: torch.Tensor, target: torch.Tensor, group: Any
) -> torch.Tensor:
    """Mean cross-entropy from vocab-sharded logits ``(..., V/t)`` without gathering them."""
    rank = dist.get_rank(group)
    start = rank * logits_local.shape[-1]
    flat = logits_local.reshape(-1, logits_local.shape[-1])
    return _VocabParallelCE.apply(flat, target.reshape(-1), start, group).mean()


def rms_norm(norm: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``norm``'s RMSNorm with an explicit ``weight`` (so its gradient can be synced)."""
    if isinstance(norm, nn.LayerNorm):
        return F.layer_norm(x, norm.normalized_shape, weight, norm.bias, norm.eps)
    return F.rms_norm(x, weight.shape, weight, norm.eps)  # as parlab.models.reference.RMSNorm


class TPEntry(nn.Module):
    """A norm followed by the one entry into the TP region that its consumers share.

    Plain TP: ``f`` on the normed output (one all-reduce of its gradient for
    wq+wk+wv together, or w1+w3). SP: the norm runs on ``S/t`` tokens, its weight
    gradient is summed over the group, then one all-gather of the sequence.
    """

    def __init__(self, norm: nn.Module, group: Any, *, sequence_parallel: bool) -> None:
        super().__init__()
        self.norm = norm
        self.group = group
        self.sequence_parallel = sequence_parallel

    @property
    def weight(self) -> torch.Tensor:
        return self.norm.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            y = rms_norm(self.norm, x, comm.grad_all_reduce(self.norm.weight, self.group))
            return comm.gather_seq(y, self.group)
        return comm.copy_to_tp(self.norm(x), self.group)


def apply_tensor_parallel(
    model: nn.Module,
    tp_group: Any,
    *,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
) -> nn.Module:
    """Shard a torchtitan-named Llama model over ``tp_group`` in place; returns it.

    With ``sequence_parallel`` the model's input tokens stay whole on every rank;
    the residual stream between blocks is ``(B, S/t, H)``. With ``loss_parallel``
    the model returns vocab-sharded logits: use ``tp_cross_entropy``.
    """
    sp = sequence_parallel
    layers = model.layers.values() if isinstance(model.layers, nn.ModuleDict) else model.layers
    for block in layers:
        attn, ffn = block.attention, block.feed_forward
        if ffn is None or not hasattr(attn, "wq"):
            raise UsageError("tensor parallelism here covers dense GQA/MHA blocks (no MoE, no MLA)")
        out = "reduce_scatter_seq" if sp else "reduce"
        for mod, column, row in ((attn, ("wq", "wk", "wv"), "wo"), (ffn, ("w1", "w3"), "w2")):
            for name in column:
                lin = getattr(mod, name)
                col = ColumnParallelLinear(lin.weight, tp_group, bias=lin.bias, input_op="none")
                setattr(mod, name, col)
            lin = getattr(mod, row)
            setattr(mod, row, RowParallelLinear(lin.weight, tp_group, bias=lin.bias, output_op=out))
        block.attention_norm = TPEntry(block.attention_norm, tp_group, sequence_parallel=sp)
        block.ffn_norm = TPEntry(block.ffn_norm, tp_group, sequence_parallel=sp)
    if model.tok_embeddings is not None:
        model.tok_embeddings = VocabParallelEmbedding(
            model.tok_embeddings.weight, tp_group, sequence_parallel=sp
        )
    elif sp:
        # a later pipeline stage: the hidden states arrive whole; keep this rank's slice
        # (RoPE still needs every position: attention sees the gathered sequence)
        def _scatter(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            x = args[0]
            if len(args) < 2:
                kwargs.setdefault("positions_S", torch.arange(x.shape[1], device=x.device))
            return (comm.scatter_seq(x, tp_group), *args[1:]), kwargs

        model.register_forward_pre_hook(_scatter, with_kwargs=True)
    if model.norm is not None:
        model.norm = TPEntry(model.norm, tp_group, sequence_parallel=sp)
        model.output = ColumnParallelLinear(
            model.output.weight, tp_group, input_op="none", gather_output=not loss_parallel
        )
    elif sp:
        # an earlier pipeline stage: send whole hidden states to the next stage
        model.register_forward_hook(lambda _m, _a, out: comm.gather_seq_replicated(out, tp_group))
    return model


def tp_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, tp_group: Any, *, loss_parallel: bool
) -> torch.Tensor:
    """The mean next-token loss from TP logits (vocab-sharded when ``loss_parallel``)."""
    if loss_parallel:
        return vocab_parallel_cross_entropy(logits, target, tp_group)
    return F.cross_entropy(logits.flatten(0, -2).float(), target.reshape(-1))


def shard_reference_grad(name: str, grad: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The slice of a reference parameter's gradient that TP rank ``rank`` holds (for tests)."""
    leaf = name.split(".")[-2] if name.endswith(".weight") else name
    if leaf in ("wq", "wk", "wv", "w1", "w3", "output", "tok_embeddings"):
        return grad.chunk(size, dim=0)[rank]
    if leaf in ("wo", "w2"):
        return grad.chunk(size, dim=1)[rank]
    return grad


def apply_torch_tensor_parallel(model: nn.Module, tp_mesh: Any) -> None:
    """torch's plain DTensor TP (``parallelize_module``): wq/wk/wv/w1/w3 column-wise, wo/w2
    row-wise; no SP, embeddings, norms and output left whole, the logits replicated."""
    plan: dict[str, Any] = {}
    for i in range(len(model.layers)):  # type: ignore[arg-type]
        for n in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "feed_forward.w1",
            "feed_forward.w3",
        ):
            plan[f"layers.{i}.{n}"] = ColwiseParallel()
        for n in ("attention.wo", "feed_forward.w2"):
            plan[f"layers.{i}.{n}"] = RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)
