"""Pipeline parallelism: stages cut from the reference model, and an executor of schedules.

``build_stage(model, stage, n_stages)`` prunes a reference model to one
stage's layers (the first keeps the embedding, the last the final norm and
output projection), as torchtitan does; ``Transformer.forward`` skips what
was pruned.

``run_schedule`` executes the schedule's per-rank action lists from
``pipeline_schedules``. What crosses the wire, per micro-batch per stage
boundary: the activation ``(b, S, H)`` forward (send to the next stage's
rank) and its gradient backward (send to the previous stage's rank),
point-to-point. Ranks walk a common clock of slots (``lockstep``, from the
schedule simulated with a backward twice a forward): at each slot a rank posts
one ``batch_isend_irecv`` holding the messages of every action that ends
there -- its own sends and the receives of its neighbours' -- so both sides
of each message are in the same slot's batch (NCCL groups them; 1F1B's
steady state, where neighbours send to each other at once, cannot deadlock),
then runs the action that starts there. Only receives are waited for. Stages
on the same rank (``pp`` = 1, or interleaving) hand tensors over in memory.

``torch_schedule`` runs the same stage modules under ``torch.distributed.pipelining``
instead (``gpipe``, ``1f1b``, and ``zbv``: ScheduleZBVZeroBubble, two stages per rank in a V,
whose backward splits into input and weight gradients so the weight half fills the bubble):
the reference parlab's executor is measured against.

Timing: each forward and backward is timed (CUDA events on GPUs, the wall
clock after the work on CPU) so the measured bubble is
``1 - busy / step time`` per rank, against ``pipeline_schedules.formula``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleZBVZeroBubble,
)

from parlab.parallel import tensor_comm
from parlab.parallel.pipeline_schedules import Action, n_stages, simulate


def build_stage(model: nn.Module, stage: int, n_stages: int, *, copy_model: bool = True) -> Any:
    """The reference model pruned to stage ``stage`` of ``n_stages`` (equal layer counts)."""
    m = copy.deepcopy(model) if copy_model else model
    n = len(m.layers)
    assert n % n_stages == 0, "layers % stages checked by the layout"
    per = n // n_stages
    m.layers = nn.ModuleList(list(m.layers)[stage * per : (stage + 1) * per])
    if stage > 0:
        m.tok_embeddings = None
        if getattr(m, "pos_embeddings", None) is not None:
            m.pos_embeddings = None
    if stage < n_stages - 1:
        m.norm = None
        m.output = None
    return m


@dataclass
class ScheduleStats:
    """What one rank measured while running its actions."""

    busy_s: float = 0.0
    """Time spent in forward and backward compute."""
    wall_s: float = 0.0
    """Step time from the first action to the last (after a device sync)."""
    loss: float | None = None
    """Sum of the micro-batch losses / m (last stage only)."""
    action_s: dict[str, float] = field(default_factory=dict)
    """Time of each action (``1F0`` -> seconds)."""
    sent_bytes: int = 0
    """Bytes this rank sent point-to-point."""

    @property
    def bubble(self) -> float:
        return 1.0 - self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


class _Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any, Any]] = []

    def start(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, name: str, t0: Any) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, t0, e))
        else:
            self.marks.append((name, t0, time.perf_counter()))

    def results(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {n: a.elapsed_time(b) / 1e3 for n, a, b in self.marks}
        return {n: b - a for n, a, b in self.marks}


@dataclass(frozen=True, kw_only=True)
class Slots:
    """The schedule on a common clock: which action starts and which ends at each slot."""

    starts: list[list[Action | None]]
    """Per rank, per slot: the action that starts there (``None``: none)."""
    ends: list[list[Action | None]]
    """Per rank, per slot: the action that ends there (its message is sent at that slot)."""


def lockstep(schedule: list[list[Action]], *, t_f: int = 1, t_b: int = 2) -> Slots:
    """Place every action on slots of ``1/v`` of a forward, from ``simulate(t_f, t_b)``.

    ``t_b = 2 t_f`` (a backward costs about two forwards) orders the messages as a real
    run produces them, so lockstep adds no idle time to GPipe, 1F1B or interleaved 1F1B
    when the real ratio is near it.
    """
    tl = simulate(schedule, t_f=float(t_f), t_b=float(t_b))
    v = n_stages(schedule) // len(schedule)
    slots = round(tl.makespan * v) + 1
    starts: list[list[Action | None]] = [[None] * slots for _ in schedule]
    ends: list[list[Action | None]] = [[None] * slots for _ in schedule]
    for r, spans in enumerate(tl.spans):
        for start, end, a in spans:
            starts[r][round(start * v)] = a
            ends[r][round(end * v)] = a
    return Slots(starts=starts, ends=ends)


def _message(a: Action, n_stages: int) -> tuple[str, int, int] | None:
    """What action ``a`` produces for another stage: (kind, destination stage, micro-batch)."""
    if a.kind == "F" and a.stage < n_stages - 1:
        return ("act", a.stage + 1, a.mb)
    if a.kind == "B" and a.stage > 0:
        return ("grad", a.stage - 1, a.mb)
    return None


class _Walker:
    """One rank's walk of the schedule's slots: the tensors in flight between its actions,
    keyed ``(kind, stage, micro-batch)``, and what it measured."""

    def __init__(
        self,
        schedule: list[list[Action]],
        stages: dict[int, nn.Module],
        *,
        microbatches: list[torch.Tensor],
        targets: list[torch.Tensor],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        act_shape: tuple[int, ...],
        act_dtype: torch.dtype,
        group: Any,
        device: torch.device,
    ) -> None:
        self.p, self.n, self.m = len(schedule), n_stages(schedule), len(microbatches)
        self.me = dist.get_rank(group) if self.p > 1 else 0
        self.stages, self.microbatches, self.targets, self.loss_fn = (
            stages, microbatches, targets, loss_fn,
        )  # fmt: skip
        self.act_shape, self.act_dtype, self.group, self.device = (
            act_shape, act_dtype, group, device,
        )  # fmt: skip
        self.inbox: dict[tuple[str, int, int], torch.Tensor] = {}
        self.produced: dict[tuple[str, int, int], torch.Tensor] = {}
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.sends_pending: list[Any] = []
        self.stats = ScheduleStats()
        self.timer = _Timer(device)
        self.loss_sum = torch.zeros((), device=device)

    def _peer(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage % self.p) if self.p > 1 else 0

    def exchange(self, ending: list[Action | None]) -> None:
        """Post, in one batch, the messages of every rank's action that ends at this slot
        (``ending[q]``: rank ``q``'s) that this rank sends or receives; wait for receives."""
        p, me = self.p, self.me
        ops = []
        n_recv = 0
        for q, b in enumerate(ending):
            msg = _message(b, self.n) if b is not None else None
            if msg is None:
                continue
            if q == me:
                tensor = self.produced.pop(msg)
                if msg[1] % p == me:
                    self.inbox[msg] = tensor
                    continue
                tensor = tensor.contiguous()
                self.stats.sent_bytes += tensor.numel() * tensor.element_size()
                tensor_comm._log("send_recv", tensor, axis="pp")
                ops.append(dist.P2POp(dist.isend, tensor, self._peer(msg[1]), self.group))
            elif msg[1] % p == me:
                buf = torch.empty(self.act_shape, dtype=self.act_dtype, device=self.device)
                ops.append(dist.P2POp(dist.irecv, buf, self._peer(q), self.group))
                self.inbox[msg] = buf
                n_recv += 1
        if ops:
            works = dist.batch_isend_irecv(ops)
            if n_recv:
                for w in works:
                    w.wait()
            else:
                self.sends_pending += works

    def act(self, a: Action) -> None:
        """Run action ``a`` (a forward or a backward of one micro-batch through one stage)."""
        mod, n = self.stages[a.stage], self.n
        t0 = self.timer.start()
        if a.kind == "F":
            x = self.microbatches[a.mb] if a.stage == 0 else self.inbox.pop(("act", a.stage, a.mb))
            if a.stage > 0:
                x.requires_grad_(True)
            self.inputs[(a.stage, a.mb)] = x
            y = mod(x)
            if a.stage == n - 1:
                y = self.loss_fn(y, self.targets[a.mb]) / self.m
                self.loss_sum += y.detach()
            else:
                self.produced[("act", a.stage + 1, a.mb)] = y.detach()
            self.outputs[(a.stage, a.mb)] = y
        else:
            y = self.outputs.pop((a.stage, a.mb))
            y.backward(None if a.stage == n - 1 else self.inbox.pop(("grad", a.stage, a.mb)))
            x = self.inputs.pop((a.stage, a.mb))
            if a.stage > 0:
                assert x.grad is not None, "a non-first stage's input requires grad"
                self.produced[("grad", a.stage - 1, a.mb)] = x.grad
        self.timer.stop(str(a), t0)

    def finish(self, t_start: float) -> ScheduleStats:
        """Wait for the sends still in flight; the stats of the walk begun at ``t_start``."""
        for w in self.sends_pending:
            w.wait()
        stats = self.stats
        stats.action_s = self.timer.results()
        stats.wall_s = time.perf_counter() - t_start
        stats.busy_s = sum(stats.action_s.values())
        if any(s == self.n - 1 for s in self.stages):
            stats.loss = float(self.loss_sum)
        assert not self.outputs and not self.inputs, "every forward was matched by its backward"
        return stats


def run_schedule(
    schedule: list[list[Action]],
    stages: dict[int, nn.Module],
    *,
    microbatches: list[torch.Tensor],
    targets: list[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    act_shape: tuple[int, ...],
    act_dtype: torch.dtype,
    group: Any,
    device: torch.device,
) -> ScheduleStats:
    """Run this rank's part of ``schedule`` over its ``stages`` (stage -> module); its stats.

    Rank ``r`` of ``group`` holds stages ``r, r+p, ...``; ``microbatches`` are the
    first stage's inputs, ``targets`` the last stage's. The summed loss is scaled
    by ``1/m`` so gradients equal those of the mean loss over the whole batch. The ranks walk
    the slots of ``lockstep`` together, as the module docstring says.
    """
    walker = _Walker(
        schedule, stages, microbatches=microbatches, targets=targets, loss_fn=loss_fn,
        act_shape=act_shape, act_dtype=act_dtype, group=group, device=device,
    )  # fmt: skip
    slots = lockstep(schedule)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_start = time.perf_counter()
    for t in range(len(slots.starts[walker.me])):
        walker.exchange([slots.ends[q][t] for q in range(walker.p)])
        a = slots.starts[walker.me][t]
        if a is not None:
            walker.act(a)
    return walker.finish(t_start)


def torch_schedule(
    stages: dict[int, nn.Module],
    n_stages: int,
    schedule: str,
    microbatches: int,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    group: Any,
    device: torch.device,
) -> Any:
    """``torch.distributed.pipelining``'s schedule over ``stages`` (stage index -> module this
    rank holds: one, or two for ``zbv``); ``step(inputs)`` on the first stage's rank,
    ``step(target=, losses=)`` on the last's."""
    sts = [PipelineStage(m, s, n_stages, device, group=group) for s, m in sorted(stages.items())]
    if schedule == "zbv":
        return ScheduleZBVZeroBubble(sts, n_microbatches=microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return cls(sts[0], n_microbatches=microbatches, loss_fn=loss_fn)
