"""The collectives of tensor and sequence parallelism, as autograd functions.

Megatron's two conjugate operators (Shoeybi et al. 2019, section 3), and
their sequence-parallel forms (Korthikanti et al. 2022). Every function takes
the TP process group explicitly; none keeps a global one. Legend:
``B`` batch, ``S`` full sequence, ``S/t`` this rank's sequence slice,
``H`` hidden, ``t`` the TP degree.

| operator | forward | backward | where |
|---|---|---|---|
| ``copy_to_tp`` (f) | identity | all-reduce of the input gradient (B,S,H) | entering a column-parallel block |
| ``reduce_from_tp`` (g) | all-reduce of the partial output (B,S,H) | identity | leaving a row-parallel block |
| ``gather_seq`` | all-gather along S: (B,S/t,H) -> (B,S,H) | reduce-scatter along S | SP: entering a column-parallel block |
| ``reduce_scatter_seq`` | reduce-scatter along S: (B,S,H) -> (B,S/t,H) | all-gather along S | SP: leaving a row-parallel block |
| ``scatter_seq`` | keep own slice along S | all-gather along S | SP: entering the sharded region |
| ``gather_seq_replicated`` | all-gather along S | keep own slice | SP: leaving it (pipeline send) |
| ``gather_last`` | all-gather along the last dim | keep own slice | gathering vocab-sharded logits |

With sequence parallelism one all-reduce (2(t-1)/t of the payload per rank)
becomes an all-gather plus a reduce-scatter ((t-1)/t each): the same bytes,
but the norms, dropouts and residual adds between them run on S/t tokens,
so their activations are divided by t. Parameters that are replicated inside
the SP region (the norm weights) see only S/t tokens each: their gradient is
summed over the TP group by ``grad_all_reduce`` (f applied to the weight).

Every call adds its payload to ``COMM_LOG`` when one is active
(``comm_log()``), so runs can report the collectives each axis issues.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

# torch 2.13 renames the tensor collectives (``*_single``); the GPU machines' torch 2.11 has only
# these names, so parlab keeps them and silences the rename notice.
warnings.filterwarnings(
    "ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor).*", category=FutureWarning
)

COMM_LOG: list[dict[str, Any]] | None = None
"""When a list, every collective appends ``{op, bytes, axis}`` (bytes: the full buffer)."""


@contextlib.contextmanager
def comm_log() -> Iterator[list[dict[str, Any]]]:
    """Record the collectives issued inside the block (forward and backward)."""
    global COMM_LOG
    prev, COMM_LOG = COMM_LOG, []
    try:
        yield COMM_LOG
    finally:
        COMM_LOG = prev


def _log(op: str, t: torch.Tensor, axis: str = "tp") -> None:
    if COMM_LOG is not None:
        COMM_LOG.append({"op": op, "bytes": t.numel() * t.element_size(), "axis": axis})


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    if _size(group) == 1:
        return x
    x = x.contiguous()
    _log("all_reduce", x)
    dist.all_reduce(x, group=group)
    return x


def all_gather_dim(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    n = _size(group)
    if n == 1:
        return x
    xt = x.movedim(dim, 0).contiguous()
    out = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    _log("all_gather", out)
    dist.all_gather_into_tensor(out, xt, group=group)
    # one contiguous copy here, so the linears that consume the gathered sequence (wq, wk,
    # wv; w1, w3) share it -- as their saved input too -- instead of each reshaping a strided
    # view into its own copy (five saved copies of B*S*H per block on 2 gloo ranks before)
    return out if dim == 0 else out.movedim(0, dim).contiguous()


def reduce_scatter_dim(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Sum over ranks, keep this rank's equal slice along ``dim``."""
    n = _size(group)
    if n == 1:
        return x
    xt = x.movedim(dim, 0).contiguous()
    assert xt.shape[0] % n == 0, "sequence length divisible by tp (checked by the layout)"
    out = torch.empty((xt.shape[0] // n, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    _log("reduce_scatter", xt)
    dist.reduce_scatter_tensor(out, xt, group=group)
    return out.movedim(0, dim)


def split_dim(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=dim)[dist.get_rank(group)].contiguous()


class _Conjugate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Any, bwd: Any) -> torch.Tensor:
        ctx.bwd = bwd
        return fwd(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.bwd(g), None, None


def conjugate(
    x: torch.Tensor,
    fwd: Callable[[torch.Tensor], torch.Tensor],
    bwd: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``fwd(x)`` forward, ``bwd(grad)`` backward: a collective and its adjoint, differentiable."""
    return _Conjugate.apply(x, fwd, bwd)


def _pair(x: torch.Tensor, group: Any, fwd: Any, bwd: Any, dim: int = 0) -> torch.Tensor:
    """``fwd(x, dim, group)`` forward, ``bwd(grad, dim, group)`` backward; at tp 1 the identity."""
    if _size(group) == 1:
        return x
    return conjugate(x, lambda t: fwd(t, dim, group), lambda g: bwd(g, dim, group))


def _identity(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return x.view_as(x)


def _all_reduce(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return all_reduce(x.clone(), group)


def copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """f: identity forward, all-reduce of the gradient backward."""
    return _pair(x, group, _identity, _all_reduce)


def reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """g: all-reduce forward, identity backward."""
    return _pair(x, group, _all_reduce, _identity)


def gather_seq(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """SP entry: all-gather the sequence forward, reduce-scatter backward."""
    return _pair(x, group, all_gather_dim, reduce_scatter_dim, dim)


def reduce_scatter_seq(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """SP exit: reduce-scatter the sequence forward, all-gather backward."""
    return _pair(x, group, reduce_scatter_dim, all_gather_dim, dim)


def scatter_seq(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """Keep this rank's slice of the sequence forward, all-gather backward."""
    return _pair(x, group, split_dim, all_gather_dim, dim)


def gather_seq_replicated(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """All-gather the sequence forward; backward keeps this rank's slice of the gradient.

    For a gathered tensor whose consumers are replicated over the group (a
    pipeline send: every TP rank of the next stage gets the same gradient back),
    so the gradient must not be summed over the group.
    """
    return _pair(x, group, all_gather_dim, split_dim, dim)


def gather_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    """All-gather the last dimension forward (vocab-sharded logits), slice backward."""
    return _pair(x, group, all_gather_dim, split_dim, x.dim() - 1)


def grad_all_reduce(w: torch.Tensor, group: Any) -> torch.Tensor:
    """A replicated parameter used on a sequence slice: sum its gradient over the group."""
    return copy_to_tp(w, group)
