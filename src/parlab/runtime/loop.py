"""The one training-step loop: every training project's steps run, are timed and metered here.

A project says what one of its steps does by subclassing ``TrainStep`` (its data, its forward
and loss, backward, the optimizer, zero_grad, and what the step records); ``run_steps`` runs
those steps in the order a ``LoopPlan`` gives and times them. Step indices count from 0 in the
order the steps run, and each step's data is drawn for its index.

The order of one run:

- ``warmup`` untimed steps;
- the *metered* step, right after the warm-up (``metered="first"``: the model-internal
  project, whose comm log and activation peak come from it) or after the timed steps
  (``metered="last"``: ``parlab train``, whose metered step is the steady state, DDP's bucket
  rebuild and lazy optimizer state behind it); it runs inside ``meter()``, the project's
  context (comm meters, peak-memory resets), so the timed steps run with no meter in the way;
- ``timed`` steps: wall time end to end (``StepTimer``: CUDA events on GPUs, ``perf_counter``
  on the CPU) and, with ``phases``, each phase's host and device time (``PhaseTimer``: data,
  forward, backward, optimizer, zero_grad).

Nothing crosses the wire here: the collectives are the ones the project's step issues.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from parlab.runtime.meters import PhaseTimer, StepTimer

METERED = ("first", "last", "none")


def next_token_loss(logits_BSV: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits against the next tokens, in float32 (the reference loss)."""
    return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.reshape(-1))


class TrainStep:
    """One training step, cut where the loop times it; a project overrides what its step does.

    ``data``, ``forward`` and ``optimizer`` have no default. ``begin`` and ``after`` are the
    project's bookkeeping outside the step's time (garbage collection, the profiler's step);
    ``end`` runs inside it, after ``zero_grad``, and returns what the step records."""

    def begin(self, i: int, *, metered: bool) -> None:
        """Before step ``i`` (nothing drawn yet); ``metered``: it is the metered step."""

    def data(self, i: int) -> Any:
        """Step ``i``'s batch on this rank."""
        raise NotImplementedError

    def forward(self, batch: Any) -> Any:
        """Forward and loss: the loss the backward starts from."""
        raise NotImplementedError

    def backward(self, loss: Any) -> None:
        """The loss's backward (a schedule that ran it inside ``forward``: nothing)."""
        loss.backward()

    def optimizer(self) -> None:
        """The optimizer's step."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Clear the gradients for the next step."""

    def end(self, i: int, loss: Any) -> Any:
        """What step ``i`` records (by default its loss)."""
        return loss

    def after(self, i: int) -> None:
        """After step ``i`` and its timing marks."""


@dataclass(frozen=True, kw_only=True)
class LoopPlan:
    """How many steps of each kind a run takes, and where the metered one goes."""

    warmup: int = 0
    """Untimed steps first."""
    timed: int = 0
    """Timed steps."""
    metered: str = "none"
    """``first`` (right after the warm-up), ``last`` (after the timed steps) or ``none``."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.timed < 0:
            raise ValueError(f"warm-up {self.warmup} and timed {self.timed} steps must be >= 0")
        if self.metered not in METERED:
            raise ValueError(f"metered {self.metered!r} is not one of {', '.join(METERED)}")

    def kinds(self) -> list[str]:
        """Each step's kind in run order: ``warmup``, ``metered`` or ``timed``."""
        first = ["metered"] if self.metered == "first" else []
        last = ["metered"] if self.metered == "last" else []
        return ["warmup"] * self.warmup + first + ["timed"] * self.timed + last

    @property
    def metered_step(self) -> int | None:
        """The metered step's index (None: no metered step)."""
        kinds = self.kinds()
        return kinds.index("metered") if "metered" in kinds else None


@dataclass(frozen=True, kw_only=True)
class LoopRecord:
    """What ``run_steps`` measured."""

    records: list[Any]
    """What each step's ``end`` returned, in run order."""
    step_times: list[float]
    """Seconds of each timed step."""
    phase_times: dict[str, dict[str, list[float]]] | None
    """``PhaseTimer.times()`` of the timed steps (None without ``phases``)."""


def run_steps(
    step: TrainStep,
    plan: LoopPlan,
    device: torch.device,
    *,
    meter: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    phases: bool = False,
) -> LoopRecord:
    """Run ``plan``'s steps of ``step`` on ``device``; see the module docstring."""
    timer = StepTimer(device)
    phase = PhaseTimer(device) if phases else None
    records: list[Any] = []
    kinds = plan.kinds()
    for i, kind in enumerate(kinds):
        step.begin(i, metered=kind == "metered")
        timed = kind == "timed"
        if timed and (i == 0 or kinds[i - 1] != "timed"):
            timer.mark()
        mark = phase.mark if timed and phase is not None else _no_mark
        if timed and phase is not None:
            phase.start()
        with meter() if kind == "metered" else contextlib.nullcontext():
            batch = step.data(i)
            mark("data")
            loss = step.forward(batch)
            mark("forward")
            step.backward(loss)
            mark("backward")
            step.optimizer()
            mark("optimizer")
            step.zero_grad()
            records.append(step.end(i, loss))
            mark("zero_grad")
            del batch, loss  # what outlives a step is the project's to hold
        if timed:
            timer.mark()
        step.after(i)
    return LoopRecord(
        records=records,
        step_times=timer.step_times(),
        phase_times=phase.times() if phase is not None else None,
    )


def _no_mark(phase: str) -> None:
    """A phase mark outside the timed steps: nothing."""
