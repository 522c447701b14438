"""The collectives of expert parallelism, as autograd functions and plain data.

What crosses the wire in one expert-parallel MoE layer (ep ranks, L = E/ep
local experts, H hidden, b bytes per element):

1. **plan exchange** -- ``all_to_all_single`` of an int64 ``[ep, L]`` matrix:
   how many tokens this rank sends to each local expert of each rank. After
   it every rank knows what it will receive (``DispatchPlan``), so the
   token exchange can use exact uneven splits. Once per forward.
2. **dispatch** -- ``all_to_all_single`` with uneven splits of the permuted
   tokens: ``sum(send_counts) x H x b`` bytes leave each rank (including the
   slice it keeps for itself). Forward; its backward is the same exchange
   with the splits swapped (gradients of the tokens travel home).
3. **combine** -- the inverse ``all_to_all_single``: expert outputs go back
   to the ranks that own the tokens (``sum(recv_counts) x H x b`` bytes).
   Its backward is a dispatch-shaped exchange of output gradients.

The naive path (every rank sees every token): ``all_gather`` of the tokens
and their gate weights and choices (``ep x T x H x b`` bytes received per
rank), local experts on the tokens routed to them, ``reduce_scatter`` (sum)
of the partial outputs. Backward: reduce-scatter of input gradients,
all-gather of output gradients.

At ep = 1 every function here is the identity and issues no collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from parlab.parallel.tensor_comm import conjugate

# torch 2.13 renamed the tensor forms (the old names warn); older torch has only the old ones.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


def build_ep_group(topology: Any, rank: int) -> Any:
    """This rank's expert-parallel process group (every rank must call this together).

    Returns ``None`` at ep = 1 (no communication) and the default group when
    the ep group is the whole world.
    """
    if topology.ep == 1:
        return None
    groups = topology.groups("ep")
    if len(groups) == 1 and groups[0] == list(range(topology.world_size)):
        return dist.group.WORLD
    mine = None
    for ranks in groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    assert mine is not None, "every rank belongs to one ep group"
    return mine


@dataclass(frozen=True, kw_only=True)
class DispatchPlan:
    """Who sends how many tokens to which expert: the dispatch as data, before execution."""

    send_counts: list[list[int]]
    """[ep][L]: tokens this rank sends to local expert l of rank r."""
    recv_counts: list[list[int]]
    """[ep][L]: tokens this rank receives from rank r for its local expert l."""

    @property
    def send_splits(self) -> list[int]:
        """Rows of the dispatch send buffer per destination rank."""
        return [sum(row) for row in self.send_counts]

    @property
    def recv_splits(self) -> list[int]:
        """Rows of the dispatch receive buffer per source rank."""
        return [sum(row) for row in self.recv_counts]

    @property
    def tokens_per_local_expert(self) -> list[int]:
        """Rows each local expert computes on this rank."""
        return [sum(col) for col in zip(*self.recv_counts, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            "send_counts": self.send_counts,
            "recv_counts": self.recv_counts,
            "send_splits": self.send_splits,
            "recv_splits": self.recv_splits,
        }


def format_plan(send_counts_by_rank: list[list[list[int]]]) -> str:
    """The whole layer's dispatch as a grid: source rank x (destination rank, local expert)."""
    ep = len(send_counts_by_rank)
    L = len(send_counts_by_rank[0][0]) if ep else 0
    head = ["src\\dst"] + [f"r{r}e{r * L + j}" for r in range(ep) for j in range(L)] + ["sent"]
    rows = [head]
    for src, counts in enumerate(send_counts_by_rank):
        flat = [c for row in counts for c in row]
        rows.append([f"rank {src}"] + [str(c) for c in flat] + [str(sum(flat))])
    recv = [
        sum(send_counts_by_rank[s][r][j] for s in range(ep)) for r in range(ep) for j in range(L)
    ]
    rows.append(["computed"] + [str(c) for c in recv] + [str(sum(recv))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def exchange_plan(send_counts_RL: torch.Tensor, group: Any) -> DispatchPlan:
    """Exchange per-expert token counts (one small all_to_all) and return the plan."""
    send = send_counts_RL.to(torch.int64)
    if group_size(group) == 1:
        recv = send.clone()
    else:
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv.view(-1), send.contiguous().view(-1), group=group)
    return DispatchPlan(send_counts=send.cpu().tolist(), recv_counts=recv.cpu().tolist())


def all_to_all_rows(
    x_NH: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
) -> torch.Tensor:
    """``all_to_all_single`` of rows with uneven splits (no autograd)."""
    if group_size(group) == 1:
        return x_NH.clone()
    out = x_NH.new_empty((sum(out_splits), *x_NH.shape[1:]))
    dist.all_to_all_single(
        out,
        x_NH.contiguous(),
        output_split_sizes=out_splits,
        input_split_sizes=in_splits,
        group=group,
    )
    return out


def all_to_all(
    x_NH: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
) -> torch.Tensor:
    """Differentiable uneven ``all_to_all_single``; backward swaps the splits."""
    return conjugate(
        x_NH,
        lambda x: all_to_all_rows(x, out_splits, in_splits, group),
        lambda g: all_to_all_rows(g, in_splits, out_splits, group),
    )


def _reduce_scatter(x: torch.Tensor, group: Any) -> torch.Tensor:
    n = group_size(group)
    if n == 1:
        return x.clone()
    out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
    _reduce_scatter_tensor(out, x.contiguous(), op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Differentiable all-gather along dim 0 (backward: reduce-scatter, sum)."""
    return conjugate(x, lambda t: all_gather_nograd(t, group), lambda g: _reduce_scatter(g, group))


def reduce_scatter(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Differentiable reduce-scatter (sum) along dim 0 (backward: all-gather)."""
    return conjugate(x, lambda t: _reduce_scatter(t, group), lambda g: all_gather_nograd(g, group))


def all_gather_nograd(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Plain all-gather along dim 0 (indices, masks: any dtype; ``all_gather`` differentiates)."""
    n = group_size(group)
    if n == 1:
        return x.clone()
    if x.dtype == torch.bool:
        return all_gather_nograd(x.to(torch.uint8), group).bool()
    out = x.new_empty((n * x.shape[0], *x.shape[1:]))
    _all_gather_tensor(out, x.contiguous(), group=group)
    return out


SLEEP_CYCLES = 400_000
"""GPU clock cycles of the spin kernel queued ahead of a phase's start event (about 0.2 ms
on a 2 GHz GPU): longer than the host needs to issue a phase's kernels or collective."""


@dataclass
class BarrierTimer:
    """Device time and bytes per named phase of a forward, for measured runs.

    Each phase is bracketed by a device synchronisation (and, with
    ``barrier``, a barrier of the ep group first, so a collective's time is
    its own and not the wait for a late peer). The ranks' compute times are
    kept apart from their waits this way; the price is that nothing
    overlaps while timing.

    On CUDA a phase's time is the CUDA events around its kernels, with a spin
    kernel (``torch.cuda._sleep``) queued before the start event: the GPU is
    busy while the host issues the phase, so the time is the phase's own GPU
    time, as nccl-tests' back-to-back loop measures a collective, not the
    host's launch cost (about 40 us for one eager ``all_reduce`` call on
    2xH200: benchmarks/collectives_small_probe.py). A phase that waits for the host inside it (a ``.tolist()``) still
    counts that wait. Elsewhere: wall time between two synchronisations.
    """

    device: torch.device
    """Where the work runs (cuda: synchronise around each phase)."""
    group: Any = None
    """The ep group to barrier on (None: no barrier)."""
    barrier: bool = True
    """Barrier before every phase (collective times exclude waiting for peers)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Phase -> accumulated seconds."""
    nbytes: dict[str, int] = field(default_factory=dict)
    """Phase -> accumulated bytes sent by this rank (collectives only)."""
    _start_event: Any = field(default=None, repr=False)
    """The CUDA event of the phase in progress."""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> float:
        if self.barrier and self.group is not None and group_size(self.group) > 1:
            self._sync()
            dist.barrier(group=self.group)
        self._sync()
        if self.device.type == "cuda":
            torch.cuda._sleep(SLEEP_CYCLES)
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        return time.perf_counter()

    def stop(self, phase: str, t0: float, nbytes: int = 0) -> None:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._sync()
            dt = self._start_event.elapsed_time(end) / 1e3
        else:
            self._sync()
            dt = time.perf_counter() - t0
        self.seconds[phase] = self.seconds.get(phase, 0.0) + dt
        self.nbytes[phase] = self.nbytes.get(phase, 0) + nbytes
