"""The exchanges of context parallelism: a ring shift of K/V blocks, and the K/V all-gather.

Legend: ``B`` batch, ``Nk`` KV heads, ``S/c`` this rank's tokens (two chunks
with causal load balancing), ``D`` head dim, ``c`` the CP degree.

- ``ring_shift_start(tensors, group)``: every rank sends its tensors to the
  next rank of the ring and receives the previous rank's, as one
  ``batch_isend_irecv`` (send/recv, payload per rank ``2*B*Nk*S/c*D`` elements
  for K and V in forward, twice that in backward with dK and dV). It returns
  at once; ``.wait()`` on the result gives the received tensors, so the next
  block's transfer overlaps this block's attention. ``c-1`` shifts per
  attention forward, ``c`` in backward.
- ``gather_kv(x, group)``: all-gather along the sequence (``B*Nk*S*D`` out per
  rank) forward, reduce-scatter of the gradient backward: the all-gather
  variant, one collective before attention instead of ``c-1`` ring steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from parlab.parallel import tensor_comm


@dataclass
class PendingShift:
    """Receive buffers of a ring shift in flight."""

    works: list[Any]
    """The send/recv requests."""
    received: list[torch.Tensor]
    """Filled once ``wait`` returns."""

    def wait(self) -> list[torch.Tensor]:
        for w in self.works:
            w.wait()
        return self.received


def ring_shift_start(tensors: list[torch.Tensor], group: Any) -> PendingShift:
    """Send ``tensors`` to the next rank, receive the previous rank's (asynchronously)."""
    n = dist.get_world_size(group)
    if n == 1:
        return PendingShift(works=[], received=list(tensors))
    rank = dist.get_rank(group)
    nxt = dist.get_global_rank(group, (rank + 1) % n)
    prv = dist.get_global_rank(group, (rank - 1) % n)
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = []
    for t, buf in zip(tensors, received, strict=True):
        tensor_comm._log("send_recv", t, axis="cp")
        ops += [dist.P2POp(dist.isend, t, nxt, group), dist.P2POp(dist.irecv, buf, prv, group)]
    works = dist.batch_isend_irecv(ops)
    return PendingShift(works=list(works), received=received)


class _GatherKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        n = dist.get_world_size(group)
        xt = x.movedim(dim, 0).contiguous()
        out = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
        tensor_comm._log("all_gather", out, axis="cp")
        dist.all_gather_into_tensor(out, xt, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        n = dist.get_world_size(ctx.group)
        gt = g.movedim(ctx.dim, 0).contiguous()
        out = torch.empty((gt.shape[0] // n, *gt.shape[1:]), dtype=g.dtype, device=g.device)
        tensor_comm._log("reduce_scatter", gt, axis="cp")
        dist.reduce_scatter_tensor(out, gt, group=ctx.group)
        return out.movedim(0, ctx.dim), None, None


def gather_kv(x: torch.Tensor, group: Any, dim: int = 2) -> torch.Tensor:
    """All-gather ``x`` along ``dim`` in rank order (reduce-scatter of the gradient backward)."""
    if dist.get_world_size(group) == 1:
        return x
    return _GatherKV.apply(x, dim, group)
