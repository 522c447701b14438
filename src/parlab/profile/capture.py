"""Capture: torch.profiler on every rank, one Chrome trace per rank.

``Profiler`` wraps ``torch.profiler.profile`` with a short schedule (skip
``wait`` steps, record but discard ``warmup`` steps, keep ``active`` steps,
one cycle) and, when the active steps are done, writes
``<out_dir>/rank<R>.trace.json.gz``. The trace carries torch's own
``distributedInfo`` (backend, rank, world size, process groups) and a
``parlab`` metadata entry (run id, rank, world size, project, label) so that
``parlab profile analyze`` can tell traces of different runs apart.

Nothing crosses the wire here: capture adds no collective. The profiler only
records what the training loop does (its collectives included) and writes a
local file.

Two ways in, for project runners::

    from parlab.profile.capture import Profiler, maybe_profile

    with Profiler(ctx, out_dir, wait=1, warmup=1, active=2) as prof:
        for step in range(steps):
            train_step()
            prof.step()          # once per optimizer step

    # or: profile only when ``parlab profile run`` asked for it
    with maybe_profile(ctx) as prof:   # a no-op unless $PARLAB_PROFILE_DIR is set
        ...
        prof.step()

``parlab profile run`` sets ``PARLAB_PROFILE_DIR`` (and the schedule in
``PARLAB_PROFILE_SCHEDULE`` = ``wait,warmup,active``, the run id in
``PARLAB_PROFILE_RUN_ID``) for the command it runs; torchrun passes the
environment on to every rank. A loop should run at least
``wait + warmup + active`` steps, else nothing is written (``done`` says so).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from parlab.runtime.context import RankContext

ENV_DIR = "PARLAB_PROFILE_DIR"
"""Folder the ranks write their traces to; set by ``parlab profile run``."""
ENV_SCHEDULE = "PARLAB_PROFILE_SCHEDULE"
"""``wait,warmup,active`` steps (default ``1,1,2``)."""
ENV_RUN_ID = "PARLAB_PROFILE_RUN_ID"
"""Run id written into every rank's trace metadata."""
ENV_PROJECT = "PARLAB_PROFILE_PROJECT"
"""Project id of the profiled run, written into the trace metadata."""

TRACE_SUFFIX = ".trace.json.gz"


def trace_path(out_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its trace."""
    return Path(out_dir) / f"rank{rank}{TRACE_SUFFIX}"


def parse_schedule(text: str) -> tuple[int, int, int]:
    """``"1,1,2"`` -> ``(wait, warmup, active)``; ``ValueError`` naming the fix."""
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or parts[0] < 0 or parts[1] < 0 or parts[2] < 1:
        raise ValueError(
            f"profile schedule {text!r} is not 'wait,warmup,active' "
            "(whole numbers, active at least 1), e.g. 1,1,2"
        )
    return parts  # type: ignore[return-value]


class Profiler:
    """torch.profiler around a training loop, stepped once per optimizer step."""

    def __init__(
        self,
        ctx: RankContext | None,
        out_dir: str | Path,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 2,
        run_id: str | None = None,
        project: str | None = None,
        label: str | None = None,
        record_shapes: bool = True,
        with_stack: bool = False,
    ) -> None:
        """``ctx`` is the rank's context (``None``: read RANK/WORLD_SIZE from the environment)."""
        parse_schedule(f"{wait},{warmup},{active}")
        self.rank = ctx.rank if ctx is not None else int(os.environ.get("RANK", "0"))
        self.world_size = (
            ctx.world_size if ctx is not None else int(os.environ.get("WORLD_SIZE", "1"))
        )
        cuda = (
            ctx.is_cuda
            if ctx is not None
            else torch.cuda.is_available() and os.environ.get("PARLAB_PROFILE_CPU_ONLY") != "1"
        )
        self.out_dir = Path(out_dir)
        self.path = trace_path(self.out_dir, self.rank)
        self.total_steps = wait + warmup + active
        self._wait = wait
        self._meta_pending = False
        self.steps = 0
        self.done = False
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._meta: dict[str, Any] = {
            "run_id": run_id or os.environ.get(ENV_RUN_ID),
            "rank": self.rank,
            "world_size": self.world_size,
            "project": project or os.environ.get(ENV_PROJECT),
            "label": label,
            "schedule": {"wait": wait, "warmup": warmup, "active": active},
            "device": "cuda" if cuda else "cpu",
        }
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._write,
            record_shapes=record_shapes,
            with_stack=with_stack,
        )

    def _write(self, prof: Any) -> None:
        # export plain JSON, then gzip at level 1: torch's own .gz export uses level 9,
        # seconds per 100 MB on the training machine's clock
        self.out_dir.mkdir(parents=True, exist_ok=True)
        plain = self.path.with_name(f".{self.path.name}.tmp.json")
        packed = self.path.with_name(f".{self.path.name}.tmp")
        try:
            prof.export_chrome_trace(str(plain))
            with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            os.replace(packed, self.path)
        finally:
            for p in (plain, packed):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        self.done = True

    def __enter__(self) -> Profiler:
        self._meta_pending = True
        if hasattr(self._prof, "preset_metadata_json"):  # torch >= 2.4
            self._prof.preset_metadata_json("parlab", json.dumps(self._meta))
            self._meta_pending = False
        self._prof.start()
        return self

    def step(self) -> None:
        """Mark the end of one training step (call it after ``optimizer.step()``)."""
        self.steps += 1
        self._prof.step()
        if self._meta_pending and self.steps > self._wait:  # recording: metadata sticks now
            self._prof.add_metadata_json("parlab", json.dumps(self._meta))
            self._meta_pending = False

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._prof.stop()


class _NoProfiler:
    """Stands in for ``Profiler`` when profiling is off: every call is a no-op."""

    done = False
    path = None

    def __enter__(self) -> _NoProfiler:
        return self

    def step(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def maybe_profile(
    ctx: RankContext | None, *, label: str | None = None, project: str | None = None
) -> Profiler | _NoProfiler:
    """A ``Profiler`` when ``$PARLAB_PROFILE_DIR`` is set (by ``parlab profile run``), else a no-op."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return _NoProfiler()
    wait, warmup, active = parse_schedule(os.environ.get(ENV_SCHEDULE, "1,1,2"))
    return Profiler(ctx, out, wait=wait, warmup=warmup, active=active, label=label, project=project)
