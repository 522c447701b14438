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

``analyze_trace`` makes one streaming pass over one file (``TraceScanner``)
and keeps only the spans it needs in compact arrays; it can also write the
file's slimmed events (pid = rank) as a gzip member of the merged trace.
``analyze_folder`` runs it over every rank's file (in parallel processes when
the files are large), checks the files belong to one run, and reports each
bad, foreign, duplicate or missing rank's file by name while analysing the rest.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from array import array
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parlab.errors import UsageError
from parlab.profile import intervals as iv
from parlab.profile.classify import (
    COMM,
    COMPUTE,
    MEMORY,
    OTHER,
    collective_name,
    compute_kind,
    is_cpu_comm,
    kernel_kind,
    payload_from_meta,
    payload_from_shapes,
)
from parlab.profile.trace_reader import (
    KINETO_CPU_OP_NOT_COMM,
    TraceFormatError,
    TraceScanner,
    read_header,
)

_KIND_CODE = {COMPUTE: 0, COMM: 1, MEMORY: 2, OTHER: 3}
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
"""Analyse files in parallel processes when together they are at least this large."""


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


# ---------------------------------------------------------------------------
# one file


_enc = json.encoder.encode_basestring  # the C string escaper json.dumps uses


def _slim(
    ev: dict[str, Any], rank: int, shift: float, extra: dict[str, Any] | None, tids: set[Any]
) -> str:
    """One event for the merged trace: pid = rank, shared clock, args trimmed."""
    tid = ev.get("tid", 0)
    tids.add(tid)
    text = (
        f'{{"ph":"X","cat":{_enc(str(ev.get("cat", "")))},"name":{_enc(str(ev.get("name", "")))},'
        f'"pid":{rank},"tid":{json.dumps(tid)},"ts":{float(ev["ts"]) + shift:.3f},'
        f'"dur":{float(ev.get("dur", 0) or 0):.3f}'
    )
    if extra:
        return text + ',"args":' + json.dumps(extra, separators=(",", ":")) + "}"
    return text + "}"


class _Collector:
    """Spans kept from one pass (compact arrays, not events)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, float]] = []
        # GPU: kernels and copies
        self.k_ts = array("d")
        self.k_end = array("d")
        self.k_kind = array("b")
        self.k_corr = array("q")
        self.k_coll = array("i")  # index into coll_names for comm kernels, else -1
        self.k_bytes = array("q")  # -1 unknown
        self.k_name = array("i")
        self.runtime: dict[int, float] = {}
        self.comm_meta: dict[int, dict[str, Any]] = {}  # record_param_comms by External id
        self.k_ext = array("q")
        # CPU: ops and gloo/c10d comm
        self.c_ts = array("d")
        self.c_end = array("d")
        self.c_name = array("i")
        self.g_ts = array("d")  # gloo transfers
        self.g_end = array("d")
        self.g_coll = array("i")
        self.g_bytes = array("q")
        self.d_ts = array("d")  # c10d enqueue ops (fallback)
        self.d_end = array("d")
        self.d_coll = array("i")
        self.d_bytes = array("q")
        self.names: dict[str, int] = {}
        self.coll_names: dict[str, int] = {}
        self.thread_names: dict[Any, str] = {}

    def name_id(self, name: str) -> int:
        i = self.names.get(name)
        if i is None:
            i = self.names[name] = len(self.names)
        return i

    def coll_id(self, name: str) -> int:
        i = self.coll_names.get(name)
        if i is None:
            i = self.coll_names[name] = len(self.coll_names)
        return i


def _comm_args(args: dict[str, Any]) -> dict[str, Any] | None:
    if "Collective name" not in args:
        return None
    keep = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype")
    return {k: args[k] for k in keep if k in args}


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
    scanner = TraceScanner(path)
    col = _Collector()
    gpu_trace: bool | None = None
    frag = None
    meta: dict[str, Any] = {}
    tids: set[Any] = set()
    try:
        for ev in scanner.events():
            if gpu_trace is None:
                meta = scanner.meta
                gpu_trace = bool(meta.get("deviceProperties"))
                if gpu_trace:  # GPU runs take compute from kernels: skip the CPU ops unread
                    scanner.skip = KINETO_CPU_OP_NOT_COMM
                if rank is None:
                    rank = _rank_of(meta, path)
                if fragment is not None:
                    frag = gzip.open(fragment, "wt", compresslevel=1)  # noqa: SIM115
            ph = ev.get("ph")
            if ph != "X":
                if ph == "M" and ev.get("name") == "thread_name":
                    col.thread_names[ev.get("tid")] = (ev.get("args") or {}).get("name", "")
                continue
            cat = ev.get("cat", "")
            name = ev.get("name", "")
            try:
                ts = float(ev["ts"])
                end = ts + float(ev.get("dur", 0) or 0)
            except (KeyError, TypeError, ValueError):
                continue
            args = ev.get("args") or {}
            if cat in _GPU_CATS:
                kind = kernel_kind(name) if cat == "kernel" else MEMORY
                col.k_ts.append(ts)
                col.k_end.append(end)
                col.k_kind.append(_KIND_CODE[kind])
                col.k_corr.append(int(args.get("correlation", -1) or -1))
                col.k_ext.append(int(args.get("External id", -1) or -1))
                col.k_name.append(col.name_id(name))
                extra = None
                if kind == COMM:
                    cmeta = _comm_args(args)
                    cname = collective_name(cmeta["Collective name"] if cmeta else name)
                    nbytes = payload_from_meta(cmeta) if cmeta else None
                    col.k_coll.append(col.coll_id(cname))
                    col.k_bytes.append(-1 if nbytes is None else nbytes)
                    extra = {"collective": cname, "bytes": nbytes}
                else:
                    col.k_coll.append(-1)
                    col.k_bytes.append(-1)
                if frag is not None:
                    frag.write(",\n" + _slim(ev, rank, shift_us, extra, tids))
                continue
            if cat in _RUNTIME_CATS:
                corr = args.get("correlation")
                if corr is not None:
                    col.runtime[int(corr)] = ts
                continue
            if cat == "user_annotation" and name.startswith("ProfilerStep#"):
                with contextlib.suppress(ValueError):
                    col.steps.append((int(name.split("#", 1)[1]), ts, end))
                if frag is not None:
                    frag.write(",\n" + _slim(ev, rank, shift_us, None, tids))
                continue
            if cat not in ("cpu_op", "user_annotation"):
                continue
            comm = is_cpu_comm(name)
            if name.startswith("record_param_comms"):
                cmeta = _comm_args(args)
                if cmeta is not None and "External id" in args:
                    col.comm_meta[int(args["External id"])] = cmeta
            elif name.startswith("gloo:"):
                cname = collective_name(name)
                nbytes = payload_from_shapes(args)
                col.g_ts.append(ts)
                col.g_end.append(end)
                col.g_coll.append(col.coll_id(cname))
                col.g_bytes.append(-1 if nbytes is None else nbytes)
                if frag is not None:
                    frag.write(
                        ",\n"
                        + _slim(ev, rank, shift_us, {"collective": cname, "bytes": nbytes}, tids)
                    )
                continue
            elif name.startswith("c10d::"):
                cname = collective_name(name)
                nbytes = payload_from_shapes(args, largest=True)
                col.d_ts.append(ts)
                col.d_end.append(end)
                col.d_coll.append(col.coll_id(cname))
                col.d_bytes.append(-1 if nbytes is None else nbytes)
            elif cat == "cpu_op" and not comm and name.startswith("aten::"):
                # only ATen ops: wrappers (autograd nodes, custom Functions, DDP's reducer
                # hooks) can hold a thread that waits for a collective
                col.c_ts.append(ts)
                col.c_end.append(end)
                col.c_name.append(col.name_id(name))
            if frag is not None and (not gpu_trace or comm) and cat == "cpu_op":
                frag.write(",\n" + _slim(ev, rank, shift_us, None, tids))
        if frag is not None:
            for tid in sorted(tids, key=str):
                gpu_stream = isinstance(tid, int) and tid < 1000 and tid not in col.thread_names
                if gpu_stream:
                    tname = f"stream {tid}"
                elif isinstance(tid, str):  # some profilers name streams "stream 7" themselves
                    tname = col.thread_names.get(tid, tid)
                else:
                    tname = col.thread_names.get(tid, f"thread {tid}")
                frag.write(
                    ",\n"
                    + json.dumps(
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": rank,
                            "tid": tid,
                            "args": {"name": tname},
                        }
                    )
                )
    finally:
        if frag is not None:
            frag.close()
    meta = scanner.meta
    if rank is None:
        rank = _rank_of(meta, path)
    if fragment is not None and frag is None:
        gzip.open(fragment, "wt").close()
    return _summarize_rank(path, rank, meta, col, scanner.events_seen, shift_us)


def _rank_of(meta: dict[str, Any], path: Path) -> int:
    info = meta.get("distributedInfo") or {}
    parlab_meta = meta.get("parlab") or {}
    for source in (info, parlab_meta):
        if isinstance(source, dict) and isinstance(source.get("rank"), int):
            return int(source["rank"])
    raise TraceFormatError(
        f"{path}: the trace names no rank (no distributedInfo.rank): "
        "capture it with torch.distributed initialised, e.g. through parlab profile run"
    )


def _world_of(meta: dict[str, Any]) -> int | None:
    for source in (meta.get("distributedInfo") or {}, meta.get("parlab") or {}):
        if isinstance(source, dict) and isinstance(source.get("world_size"), int):
            return int(source["world_size"])
    return None


def _np(a: array) -> np.ndarray:
    return np.frombuffer(a, dtype=a.typecode if a.typecode != "b" else np.int8).copy()


def _summarize_rank(
    path: Path,
    rank: int,
    meta: dict[str, Any],
    col: _Collector,
    n_events: int,
    shift_us: float,
) -> RankProfile:
    steps = sorted(col.steps)
    gpu = len(col.k_ts) > 0
    coll_names = {i: n for n, i in col.coll_names.items()}
    names = {i: n for n, i in col.names.items()}
    if gpu:
        ts = _np(col.k_ts)
        end = _np(col.k_end)
        kind = _np(col.k_kind)
        coll = _np(col.k_coll)
        nbytes = _np(col.k_bytes)
        name_ids = _np(col.k_name)
        # fill in payloads from record_param_comms where the kernel carried none
        ext = _np(col.k_ext)
        for i in np.flatnonzero((kind == 1) & (nbytes < 0)):
            cmeta = col.comm_meta.get(int(ext[i]))
            if cmeta:
                b = payload_from_meta(cmeta)
                if b is not None:
                    nbytes[i] = b
        corr = _np(col.k_corr)
        # a kernel whose launch the trace does not hold was queued before the profiler's active
        # window: counted into the first step it would inflate it (88.9 ms instead of 70.4 ms,
        # 60 collectives instead of 34 on a 2xH200 DDP trace); HTA drops such kernels too
        seen = np.array([int(c) in col.runtime for c in corr], dtype=bool)
        if not col.runtime:  # a trace without runtime events: its kernels' own times
            seen[:] = True
        unlaunched = int((~seen).sum())
        ts, end, kind, coll, nbytes, name_ids, corr = (
            a[seen] for a in (ts, end, kind, coll, nbytes, name_ids, corr)
        )
        launch = np.array([col.runtime.get(int(c), t) for c, t in zip(corr, ts, strict=True)])
    else:
        g_ts, g_end, g_coll, g_bytes = _cpu_comm(col)
        ts = np.r_[_np(col.c_ts), g_ts]
        end = np.r_[_np(col.c_end), g_end]
        n_c = len(col.c_ts)
        unlaunched = 0
        kind = np.r_[np.zeros(n_c, dtype=np.int8), np.ones(len(g_ts), dtype=np.int8)]
        coll = np.r_[np.full(n_c, -1, dtype=np.int64), g_coll]
        nbytes = np.r_[np.full(n_c, -1, dtype=np.int64), g_bytes]
        name_ids = np.r_[_np(col.c_name).astype(np.int64), np.full(len(g_ts), -1)]
        launch = ts
    # step of every span: the step window holding its launch (CPU: its start)
    if steps:
        starts = np.array([s[1] for s in steps])
        step_of = np.searchsorted(starts, launch, side="right") - 1
        inside = step_of >= 0
        step_end = np.array([s[2] for s in steps])
        if not gpu:  # CPU events after the last step's end belong to no step
            inside &= launch <= step_end[np.clip(step_of, 0, None)]
        step_ids = [s[0] for s in steps]
    else:
        step_of = np.zeros(len(ts), dtype=np.int64)
        inside = np.ones(len(ts), dtype=bool)
        step_ids = [-1]
    results: list[StepStats] = []
    lanes: dict[int, dict[str, list[list[float]]]] = {}
    per_coll: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0, 1])
    hot: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
    gpu_first = []
    for k in range(len(step_ids)):
        m = inside & (step_of == k)
        gpu_first.append(float(ts[m].min()) if m.any() else None)
    for k, step_id in enumerate(step_ids):
        m = inside & (step_of == k)
        if not m.any():
            continue
        s, e, kd = ts[m], end[m], kind[m]
        if gpu:
            lo = gpu_first[k]
            nxt = next((f for f in gpu_first[k + 1 :] if f is not None), None)
            if nxt is not None:
                hi = nxt
            else:  # the last step: its CPU step's length, or its last kernel if later
                cpu_len = steps[k][2] - steps[k][1] if steps else 0.0
                hi = max(float(e.max()), lo + cpu_len)
        elif steps:
            lo, hi = steps[k][1], steps[k][2]
        else:  # no step marks: the whole trace is one step
            lo, hi = float(s.min()), float(e.max())
        # what runs past the window (a transfer finishing after the step mark) is cut off
        comp = iv.clip(iv.union(s[kd == 0], e[kd == 0]), lo, hi)
        comm = iv.clip(iv.union(s[kd == 1], e[kd == 1]), lo, hi)
        mem = iv.clip(iv.union(s[kd == 2], e[kd == 2]), lo, hi)
        busy = iv.union(s, e)  # everything the device ran, synchronisation kernels too
        busy_in = iv.measure(iv.clip(busy, lo, hi))
        overlap = iv.intersection(comm, comp)
        comm_t = iv.measure(comm)
        cm = kd == 1
        cs, ce = s[cm], e[cm]
        exposed_each = (ce - cs) - iv.covered(cs, ce, comp)
        # concurrent collectives would count shared exposed time twice: scale each one's
        # share so that they add up to the step's exposed communication
        total_each = float(exposed_each.sum())
        if total_each > 0:
            exposed_each = exposed_each * (max(comm_t - overlap, 0.0) / total_each)
        cb = nbytes[m][cm]
        cc = coll[m][cm]
        for c, b, dur, ex in zip(cc, cb, ce - cs, exposed_each, strict=True):
            rec = per_coll[int(c)]
            rec[0] += 1
            rec[1] += max(int(b), 0)
            rec[2] += float(dur)
            rec[3] += float(ex)
            if b < 0:
                rec[4] = 0
        nm = name_ids[m][kd == 0]
        dur_c = (e - s)[kd == 0]
        if len(nm):
            uniq, inv = np.unique(nm, return_inverse=True)
            sums = np.bincount(inv, weights=dur_c)
            counts = np.bincount(inv)
            for u, tot, cnt in zip(uniq, sums, counts, strict=True):
                h = hot[int(u)]
                h[0] += int(cnt)
                h[1] += float(tot)
        results.append(
            StepStats(
                step=step_id,
                window_s=(hi - lo) / 1e6,
                compute_s=iv.measure(comp) / 1e6,
                comm_s=comm_t / 1e6,
                overlap_s=overlap / 1e6,
                exposed_s=max(comm_t - overlap, 0.0) / 1e6,
                idle_s=max(hi - lo - busy_in, 0.0) / 1e6,
                comm_count=int(cm.sum()),
                comm_bytes=int(np.clip(cb, 0, None).sum()),
                last_comm_start_us=float(cs.max()) + shift_us if len(cs) else None,
            )
        )
        lanes[step_id] = {
            "compute": _spans_list(comp, shift_us),
            "comm": _spans_list(comm, shift_us),
            "memory": _spans_list(mem, shift_us),
            "window": [[lo + shift_us, hi + shift_us]],
        }
    colls = [
        CollectiveStats(
            name=coll_names[c],
            count=int(r[0]),
            bytes=int(r[1]),
            bytes_known=bool(r[4]),
            time_s=r[2] / 1e6,
            exposed_s=r[3] / 1e6,
        )
        for c, r in per_coll.items()
    ]
    colls.sort(key=lambda c: (-c.exposed_s, -c.time_s, c.name))
    compute_hot = sorted(
        (
            {"name": names.get(u, "?"), "count": int(h[0]), "time_s": h[1] / 1e6}
            for u, h in hot.items()
            if u >= 0
        ),
        key=lambda d: -d["time_s"],
    )[:10]
    by_kind: dict[str, float] = {}
    for u, h in hot.items():
        if u >= 0:
            k = compute_kind(names.get(u, "?"))
            by_kind[k] = by_kind.get(k, 0.0) + h[1] / 1e6 / max(1, len(results))
    by_kind = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
    parlab_meta = meta.get("parlab") if isinstance(meta.get("parlab"), dict) else {}
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    return RankProfile(
        path=str(path),
        rank=rank,
        world_size=_world_of(meta),
        run_id=parlab_meta.get("run_id"),
        label=parlab_meta.get("label"),
        project=parlab_meta.get("project"),
        backend=info.get("backend"),
        device="cuda" if gpu else "cpu",
        events=n_events,
        steps=results,
        collectives=colls,
        lanes=lanes,
        compute_hotspots=compute_hot,
        compute_by_kind=by_kind,
        unlaunched_kernels=unlaunched,
    )


def _cpu_comm(col: _Collector) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Communication spans of a CPU run: gloo's transfers, named by the c10d ops that issued them.

    gloo runs some collectives as others (a reduce-scatter is an all-reduce of the
    whole buffer), so when the c10d ops and the gloo transfers pair up one to one
    (same count; both in issue order, gloo's queue is first in, first out) the
    c10d op gives the name and, where it knows it, the payload. Without gloo
    events the c10d ops themselves are the spans.
    """
    d_ts, d_end = _np(col.d_ts), _np(col.d_end)
    d_coll, d_bytes = _np(col.d_coll).astype(np.int64), _np(col.d_bytes)
    if len(col.g_ts) == 0:
        return d_ts, d_end, d_coll, d_bytes
    g_ts, g_end = _np(col.g_ts), _np(col.g_end)
    g_coll, g_bytes = _np(col.g_coll).astype(np.int64), _np(col.g_bytes)
    if len(d_ts) == len(g_ts):
        go, do = np.argsort(g_ts, kind="stable"), np.argsort(d_ts, kind="stable")
        g_ts, g_end, g_coll, g_bytes = g_ts[go], g_end[go], d_coll[do], g_bytes[go]
        known = d_bytes[do] >= 0
        g_bytes = np.where(known, d_bytes[do], g_bytes)
    return g_ts, g_end, g_coll, g_bytes


def _spans_list(spans: iv.Spans, shift: float, limit: int = 20000) -> list[list[float]]:
    s, e = spans
    if len(s) > limit:  # keep the timeline drawable: merge the smallest gaps away
        gaps = s[1:] - e[:-1]
        cut = np.sort(gaps)[len(gaps) - limit]
        keep = np.r_[True, gaps >= cut]
        idx = np.flatnonzero(keep)
        e = np.r_[e[idx[1:] - 1], e[-1]]
        s = s[idx]
    return [[float(a) + shift, float(b) + shift] for a, b in zip(s, e, strict=True)]


# ---------------------------------------------------------------------------
# a folder


TRACE_GLOBS = ("*.json", "*.json.gz")


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


def analyze_folder(
    folder: str | Path,
    *,
    fragments_dir: str | Path | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunProfile:
    """Analyse every rank's trace in ``folder``; bad, foreign and missing files become ``problems``.

    Files from more than one run (different parlab run ids, or different
    world sizes) keep the largest group (the newest on a tie) and name the
    others; two files for one rank keep the newer. ``UsageError`` only when
    no file at all can be analysed.
    """
    folder = Path(folder)
    paths = find_traces(folder)
    problems: list[Problem] = []
    heads: list[tuple[Path, dict[str, Any], int]] = []
    for p in paths:
        try:
            meta = read_header(p)
            heads.append((p, meta, _rank_of(meta, p)))
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

    def run_key(h: tuple[Path, dict[str, Any], int]) -> tuple[str, int | None]:
        parlab_meta = h[1].get("parlab") if isinstance(h[1].get("parlab"), dict) else {}
        return str(parlab_meta.get("run_id")), _world_of(h[1])

    groups: dict[tuple[str, int | None], list[tuple[Path, dict[str, Any], int]]] = defaultdict(list)
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
    by_rank: dict[int, tuple[Path, dict[str, Any], int]] = {}
    for h in sorted(groups[key], key=lambda h: os.path.getmtime(h[0])):
        if h[2] in by_rank:
            problems.append(
                Problem(
                    path=str(by_rank[h[2]][0]),
                    message=f"{by_rank[h[2]][0]}: a second trace for rank {h[2]} "
                    f"(kept the newer {h[0].name}); skipped",
                )
            )
        by_rank[h[2]] = h
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
    bases = {r: float(h[1].get("baseTimeNanoseconds", 0) or 0) / 1e3 for r, h in by_rank.items()}
    base0 = min(bases.values())
    jobs = [
        _Job(
            path=h[0],
            rank=r,
            shift_us=bases[r] - base0,
            fragment=Path(fragments_dir) / f"rank{r}.frag.gz" if fragments_dir else None,
        )
        for r, h in sorted(by_rank.items())
    ]
    total = sum(j.path.stat().st_size for j in jobs)
    n_workers = workers or min(len(jobs), len(os.sched_getaffinity(0)))
    out: list[RankProfile | Problem]
    if n_workers > 1 and total >= PARALLEL_MIN_BYTES and len(jobs) > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(n_workers, mp_context=mp.get_context("fork")) as pool:
            out = list(pool.map(_run_job, jobs))
    else:
        out = [_run_job(j) for j in jobs]
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
