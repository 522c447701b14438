"""The collectives data parallelism and ZeRO use, and the flat buffers they move.

Three collectives, each on the data-parallel group only:

- ``all_reduce_``: every rank ends with the sum of everyone's tensor (DDP's
  gradient averaging; payload = the tensor).
- ``reduce_scatter_``: the sum of everyone's full buffer, rank r keeping only
  chunk r (ZeRO's gradient reduction; payload = the full buffer).
- ``all_gather_``: every rank's chunk r concatenated into the full buffer on
  every rank (ZeRO's parameter gather; payload = the full buffer).

Each returns the async ``Work`` when ``async_op`` is set (call ``.wait()``
before reading the result), else ``None``. The output of a reduce-scatter
may be the input's own chunk ``r`` and the input of an all-gather may be the
output's own chunk ``r`` (in place, as NCCL allows): parlab's ZeRO relies on
it so that a rank's shard is a view of its full buffer and costs no copy.

``FlatUnit`` lays a group of parameters out in one flat buffer, padded to a
multiple of the group size, so that chunk ``r`` is rank r's shard:

    [ p0 | p1 | ... | pk | pad ]   numel = sum(p.numel()), padded = ceil(numel / N) * N
    [  rank 0  |  rank 1 | ... ]   shard_numel = padded / N
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# torch >= 2.13 names the tensor forms *_single; older releases only have *_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_reduce_(t: torch.Tensor, group: Any = None, *, async_op: bool = False) -> Any:
    """Sum ``t`` over the group, in place."""
    return dist.all_reduce(t, group=group, async_op=async_op)


def reduce_scatter_(
    out: torch.Tensor, full: torch.Tensor, group: Any = None, *, async_op: bool = False
) -> Any:
    """``out`` = chunk ``rank`` of the group's sum of ``full``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _reduce_scatter(out, full, group=group, async_op=async_op)


def all_gather_(
    full: torch.Tensor, shard: torch.Tensor, group: Any = None, *, async_op: bool = False
) -> Any:
    """``full`` = every rank's ``shard`` concatenated in rank order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _all_gather(full, shard, group=group, async_op=async_op)


class FlatUnit:
    """Parameters laid out in one flat buffer, padded so that N ranks get equal chunks."""

    def __init__(self, name: str, params: list[nn.Parameter], world: int, rank: int) -> None:
        self.name = name
        self.params = params
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        self.numel = self.offsets[-1]
        self.world = world
        self.rank = rank
        self.shard_numel = math.ceil(self.numel / world) if self.numel else 0
        self.padded = self.shard_numel * world

    def shard_slice(self) -> slice:
        return slice(self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel)

    def flatten(
        self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """One padded flat buffer of ``tensors`` (same order and sizes as the parameters)."""
        t0 = tensors[0]
        out = torch.zeros(self.padded, dtype=dtype or t0.dtype, device=t0.device)
        for t, a, b in zip(tensors, self.offsets[:-1], self.offsets[1:], strict=True):
            out[a:b].copy_(t.reshape(-1))
        return out

    def bind(self, full: torch.Tensor) -> None:
        """Point every parameter's data at its piece of ``full``."""
        for p, shape, a, b in zip(
            self.params, self.shapes, self.offsets[:-1], self.offsets[1:], strict=True
        ):
            p.data = full[a:b].view(shape)

    def bind_grads(self, full_grad: torch.Tensor) -> None:
        """Make every parameter's ``.grad`` a view of ``full_grad`` (autograd accumulates into it)."""
        for p, shape, a, b in zip(
            self.params, self.shapes, self.offsets[:-1], self.offsets[1:], strict=True
        ):
            p.grad = full_grad[a:b].view(shape)

    def release(self) -> None:
        """Drop the parameters' data (ZeRO-3 between uses); shapes stay known here."""
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
