"""What the analysis of one run's traces yields: per step, per collective, per rank, per run.

Plain frozen records (times in seconds, spans in microseconds on the shared clock); the
definitions of each figure are in ``parlab.profile.analyze``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """One rank's times in one profiled step (seconds)."""

    step: int
    """The ``ProfilerStep#N`` number (-1 when the trace has no step marks)."""
    window_s: float
    """The step's length on this rank's device (GPU window or CPU step span)."""
    compute_s: float
    """Union of compute spans."""
    comm_s: float
    """Union of communication spans."""
    overlap_s: float
    """Communication that runs while compute runs."""
    exposed_s: float
    """Communication with no compute beside it: ``comm_s - overlap_s``."""
    idle_s: float
    """Window time with nothing running."""
    comm_count: int
    """Collectives (kernels or gloo transfers) started in the step."""
    comm_bytes: int
    """Their payload, where known."""
    last_comm_start_us: float | None
    """Start of the step's last collective, microseconds on the shared clock."""


@dataclass(frozen=True, kw_only=True)
class CollectiveStats:
    """One collective's totals over the profiled steps on one rank."""

    name: str
    """Normalised collective (``all_reduce``, ``all_gather``, ...)."""
    count: int
    """How many ran."""
    bytes: int
    """Their payload, summed (nccl-tests' convention); 0 when unknown."""
    bytes_known: bool
    """Whether every one of them had a known payload."""
    time_s: float
    """Sum of their durations."""
    exposed_s: float
    """Its share of the exposed communication: the part of its spans no compute covers,
    scaled so that concurrent collectives add up to the step's exposed time."""


@dataclass(frozen=True, kw_only=True)
class RankProfile:
    """What one rank's trace says."""

    path: str
    """The trace file."""
    rank: int
    """Global rank (from ``distributedInfo`` or parlab's metadata)."""
    world_size: int | None
    """World size the trace reports."""
    run_id: str | None
    """parlab's run id in the trace metadata, where present."""
    label: str | None
    """parlab's label for the profiled configuration, where present."""
    project: str | None
    """Project id in the trace metadata, where present."""
    backend: str | None
    """``nccl``/``gloo`` from ``distributedInfo``."""
    device: str
    """``cuda`` when the trace has GPU kernels, else ``cpu``."""
    events: int
    """Events read."""
    steps: list[StepStats]
    """Per profiled step."""
    collectives: list[CollectiveStats]
    """Per collective, largest exposed time first."""
    lanes: dict[int, dict[str, list[list[float]]]]
    """Step -> lane (compute, comm, memory) -> merged ``[start_us, end_us]`` spans."""
    compute_hotspots: list[dict[str, Any]] = field(default_factory=list)
    """The longest compute kernels or CPU ops by total time: name, count, time_s."""
    compute_by_kind: dict[str, float] = field(default_factory=dict)
    """Compute kernel (CPU: ATen op) time per step by ``classify.compute_kind``, seconds: the
    sum of the kernels' durations (kernels on several streams can add up to more than the
    compute lane's union)."""
    unlaunched_kernels: int = 0
    """GPU kernels left out because the trace holds no launch for them (queued before the
    profiler's active window, so they belong to no profiled step)."""


@dataclass(frozen=True, kw_only=True)
class Problem:
    """A file that could not be analysed (or a rank that has no file), and why."""

    path: str
    """The file (or the folder, for a missing rank)."""
    message: str
    """One line naming what is wrong and what was done about it."""


@dataclass(frozen=True, kw_only=True)
class RunProfile:
    """Every usable rank of one run, and what was wrong with the rest."""

    folder: str
    """The trace folder."""
    ranks: list[RankProfile]
    """Analysed ranks, by rank."""
    problems: list[Problem]
    """Files skipped and ranks missing."""
    world_size: int
    """The run's world size."""
    run_id: str | None
    """The profiled run's id, where the traces carry one."""
