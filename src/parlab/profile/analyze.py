"""Per-rank and per-step analysis of profiler traces: overlap, exposed communication, idle, hotspots.

Definitions (times per rank and per step; the step is ``ProfilerStep#N``):

- GPU runs: compute is every kernel that is not NCCL and not a copy. A kernel belongs to the step whose CPU window holds its launch
  (matched by the ``correlation`` id of the launch and the kernel); a kernel whose launch the
  trace does not hold (queued before the active window) is left out and counted, as Holistic
  Trace Analysis drops it. The
  step's GPU window runs from its first kernel to the next step's first
  kernel (the last step: for its CPU step's length, or to its last kernel's
  end if that is later).
  CPU runs (gloo): compute is the ``aten::`` ops (not the wrappers around
  them, which may wait for a collective), communication is gloo's transfers;
  the step window is the ``ProfilerStep#N`` span; an event belongs to the step
  its start lies in.
- compute time = length of the union of compute spans; communication time =
  length of the union of communication spans;
- overlap fraction = |comm ∩ compute| ÷ |comm| (Holistic Trace Analysis's
  definition); exposed communication = |comm| − |comm ∩ compute|;
- idle = window − |union of everything the device ran| (kernels and copies;
  on CPU, compute and communication);
- per collective (``all_reduce``, ``all_gather``, ...): count, payload bytes,
  time (sum of its spans) and exposed time (the part of its spans no compute
  covers), the hotspot ranking;
- stragglers (across ranks, in ``summarize``): in each step, the rank whose
  last collective starts latest, and how much later than the earliest rank's.
  Timestamps are the profiler's wall clock shifted by each trace's
  ``baseTimeNanoseconds``; ranks on different hosts are only as comparable as
  their clocks.

``analyze_trace`` makes one streaming pass over one file (``collect.scan_trace``: only the
spans it needs, in compact arrays; optionally the file's slimmed events, pid = rank, as a gzip
member of the merged trace), then ``rank_summary`` and ``overlap`` do the arithmetic.
``analyze_folder`` runs it over every rank's file (in parallel processes when
the files are large), checks the files belong to one run, and reports each
bad, foreign, duplicate or missing rank's file by name while analysing the rest.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parlab.errors import UsageError
from parlab.profile.collect import rank_of, scan_trace, world_of
from parlab.profile.profiles import Problem, RankProfile, RunProfile
from parlab.profile.rank_summary import summarize_rank
from parlab.profile.trace_reader import TraceFormatError, read_header

PARALLEL_MIN_BYTES = 32 * 1024 * 1024
"""Analyse files in parallel processes when together they are at least this large."""
TRACE_GLOBS = ("*.json", "*.json.gz")

_Head = tuple[Path, dict[str, Any], int]  # a file, its metadata, its rank
_RunKey = tuple[str, int | None]  # parlab run id (str(None) without one), world size


def analyze_trace(
    path: str | Path,
    *,
    fragment: str | Path | None = None,
    shift_us: float = 0.0,
    rank: int | None = None,
) -> RankProfile:
    """One streaming pass over one rank's trace; optionally write its merged-trace fragment.

    ``fragment``: a gzip member of ``,{event}`` lines (pid = rank) appended to the
    merged trace. ``shift_us`` moves this trace's timestamps onto the shared clock.
    ``TraceFormatError`` names the file when it is not a usable trace.
    """
    path = Path(path)
    col, meta, rank, n_events = scan_trace(path, fragment=fragment, shift_us=shift_us, rank=rank)
    return summarize_rank(path, rank, meta, col, n_events, shift_us)


def find_traces(folder: Path) -> list[Path]:
    """Trace-looking files directly in ``folder`` (not hidden, not parlab's own outputs)."""
    if not folder.is_dir():
        raise UsageError(
            f"trace folder {folder} does not exist: pass the folder the ranks wrote "
            "(e.g. the --trace-dir of parlab profile run)"
        )
    found: set[Path] = set()
    for pattern in TRACE_GLOBS:
        found.update(folder.glob(pattern))
    return sorted(
        p for p in found if p.is_file() and not p.name.startswith(".") and "merged" not in p.name
    )


@dataclass(frozen=True)
class _Job:
    path: Path
    rank: int
    shift_us: float
    fragment: Path | None


def _run_job(job: _Job) -> RankProfile | Problem:
    try:
        return analyze_trace(job.path, fragment=job.fragment, shift_us=job.shift_us, rank=job.rank)
    except TraceFormatError as exc:
        return Problem(path=str(job.path), message=f"{exc}; skipped, the rest analysed")
    except MemoryError:
        return Problem(path=str(job.path), message=f"{job.path}: out of memory while analysing")


def _read_heads(folder: Path, problems: list[Problem]) -> list[_Head]:
    """Every trace file's header; ``UsageError`` when no file has a usable one."""
    heads: list[_Head] = []
    for p in find_traces(folder):
        try:
            meta = read_header(p)
            heads.append((p, meta, rank_of(meta, p)))
        except TraceFormatError as exc:
            problems.append(Problem(path=str(p), message=f"{exc}; skipped, the rest analysed"))
    if not heads:
        subs = sorted(d.name for d in folder.iterdir() if d.is_dir() and any(d.glob("*.json*")))
        detail = "; ".join(pr.message for pr in problems) or (
            f"no .json or .json.gz files in it (its subfolders {', '.join(subs[:5])} hold "
            "traces: analyse one of them)"
            if subs
            else "no .json or .json.gz files in it"
        )
        raise UsageError(f"no usable trace in {folder}: {detail}")
    return heads


def _main_run(heads: list[_Head], problems: list[Problem]) -> tuple[_RunKey, list[_Head]]:
    """The largest group of files from one run (the newest on a tie); the others are problems."""

    def run_key(h: _Head) -> _RunKey:
        parlab_meta = h[1].get("parlab") if isinstance(h[1].get("parlab"), dict) else {}
        return str(parlab_meta.get("run_id")), world_of(h[1])

    groups: dict[_RunKey, list[_Head]] = defaultdict(list)
    for h in heads:
        groups[run_key(h)].append(h)
    key = max(
        groups, key=lambda k: (len(groups[k]), max(os.path.getmtime(h[0]) for h in groups[k]))
    )
    for k, hs in groups.items():
        if k == key:
            continue
        for h in hs:
            problems.append(
                Problem(
                    path=str(h[0]),
                    message=f"{h[0]}: from a different run (run id {k[0]}, world size {k[1]}; "
                    f"the folder's main run is {key[0]}, world size {key[1]}); skipped",
                )
            )
    return key, groups[key]


def _one_per_rank(heads: list[_Head], problems: list[Problem]) -> dict[int, _Head]:
    """Each rank's newest file; the older ones are problems."""
    by_rank: dict[int, _Head] = {}
    for h in sorted(heads, key=lambda h: os.path.getmtime(h[0])):
        if h[2] in by_rank:
            problems.append(
                Problem(
                    path=str(by_rank[h[2]][0]),
                    message=f"{by_rank[h[2]][0]}: a second trace for rank {h[2]} "
                    f"(kept the newer {h[0].name}); skipped",
                )
            )
        by_rank[h[2]] = h
    return by_rank


def _jobs(by_rank: dict[int, _Head], fragments_dir: str | Path | None) -> list[_Job]:
    """One job per rank, its timestamps shifted onto the earliest trace's clock."""
    bases = {r: float(h[1].get("baseTimeNanoseconds", 0) or 0) / 1e3 for r, h in by_rank.items()}
    base0 = min(bases.values())
    return [
        _Job(
            path=h[0],
            rank=r,
            shift_us=bases[r] - base0,
            fragment=Path(fragments_dir) / f"rank{r}.frag.gz" if fragments_dir else None,
        )
        for r, h in sorted(by_rank.items())
    ]


def _run_jobs(jobs: list[_Job], workers: int | None) -> list[RankProfile | Problem]:
    """Every job, in forked worker processes when the files are large enough to pay for them."""
    total = sum(j.path.stat().st_size for j in jobs)
    n_workers = workers or min(len(jobs), len(os.sched_getaffinity(0)))
    if n_workers > 1 and total >= PARALLEL_MIN_BYTES and len(jobs) > 1:
        with ProcessPoolExecutor(n_workers, mp_context=mp.get_context("fork")) as pool:
            return list(pool.map(_run_job, jobs))
    return [_run_job(j) for j in jobs]


def analyze_folder(
    folder: str | Path,
    *,
    fragments_dir: str | Path | None = None,
    workers: int | None = None,
) -> RunProfile:
    """Analyse every rank's trace in ``folder``; bad, foreign and missing files become ``problems``.

    Files from more than one run (different parlab run ids, or different
    world sizes) keep the largest group (the newest on a tie) and name the
    others; two files for one rank keep the newer. ``UsageError`` only when
    no file at all can be analysed.
    """
    folder = Path(folder)
    problems: list[Problem] = []
    key, group = _main_run(_read_heads(folder, problems), problems)
    by_rank = _one_per_rank(group, problems)
    world = key[1] or (max(by_rank) + 1)
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        problems.append(
            Problem(
                path=str(folder),
                message=f"{folder}: no trace for rank(s) {missing} of {world} "
                f"(expected e.g. rank{missing[0]}.trace.json.gz); analysed the other ranks",
            )
        )
    out = _run_jobs(_jobs(by_rank, fragments_dir), workers)
    ranks = [r for r in out if isinstance(r, RankProfile)]
    problems += [p for p in out if isinstance(p, Problem)]
    if not ranks:
        raise UsageError(f"no usable trace in {folder}: " + "; ".join(p.message for p in problems))
    problems += [
        Problem(
            path=r.path,
            message=f"rank {r.rank}: {r.unlaunched_kernels} GPU kernel(s) with no launch in the "
            "trace (queued before the profiler's active window) left out of every step, as "
            "Holistic Trace Analysis does",
        )
        for r in ranks
        if r.unlaunched_kernels
    ]
    return RunProfile(
        folder=str(folder),
        ranks=sorted(ranks, key=lambda r: r.rank),
        problems=problems,
        world_size=world,
        run_id=None if key[0] == "None" else key[0],
    )
