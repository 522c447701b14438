"""From one rank's collected spans to its ``RankProfile``: steps, collectives, compute hotspots.

GPU runs: kernels and copies, each in the step whose CPU window holds its launch (kernels
with no launch in the trace are left out and counted, as Holistic Trace Analysis drops them);
CPU runs: ATen ops and gloo's transfers, each in the step its start lies in.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from parlab.profile.classify import compute_kind, payload_from_meta
from parlab.profile.collect import Collector, as_numpy, world_of
from parlab.profile.overlap import measure_step, step_window
from parlab.profile.profiles import CollectiveStats, RankProfile, StepStats


class _Spans(NamedTuple):
    """Every span a rank's steps are made of, in parallel arrays (microseconds)."""

    ts: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    """0 compute, 1 communication, 2 memory, 3 other."""
    coll: np.ndarray
    """Index into the collector's ``coll_names`` for communication, else -1."""
    nbytes: np.ndarray
    """Payload, -1 unknown."""
    name_ids: np.ndarray
    """Index into the collector's ``names`` (-1 for CPU communication)."""
    launch: np.ndarray
    """When it was launched (CPU: its start): what places it in a step."""
    unlaunched: int
    """GPU kernels left out for want of a launch."""


def _gpu_spans(col: Collector) -> _Spans:
    """Kernels and copies, payloads filled in from ``record_param_comms``, unlaunched dropped."""
    ts = as_numpy(col.k_ts)
    end = as_numpy(col.k_end)
    kind = as_numpy(col.k_kind)
    coll = as_numpy(col.k_coll)
    nbytes = as_numpy(col.k_bytes)
    name_ids = as_numpy(col.k_name)
    # fill in payloads from record_param_comms where the kernel carried none
    ext = as_numpy(col.k_ext)
    for i in np.flatnonzero((kind == 1) & (nbytes < 0)):
        cmeta = col.comm_meta.get(int(ext[i]))
        if cmeta:
            b = payload_from_meta(cmeta)
            if b is not None:
                nbytes[i] = b
    corr = as_numpy(col.k_corr)
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
    return _Spans(ts, end, kind, coll, nbytes, name_ids, launch, unlaunched)


def _cpu_spans(col: Collector) -> _Spans:
    """ATen ops (compute) then the communication spans of ``_cpu_comm``."""
    g_ts, g_end, g_coll, g_bytes = _cpu_comm(col)
    ts = np.r_[as_numpy(col.c_ts), g_ts]
    end = np.r_[as_numpy(col.c_end), g_end]
    n_c = len(col.c_ts)
    kind = np.r_[np.zeros(n_c, dtype=np.int8), np.ones(len(g_ts), dtype=np.int8)]
    coll = np.r_[np.full(n_c, -1, dtype=np.int64), g_coll]
    nbytes = np.r_[np.full(n_c, -1, dtype=np.int64), g_bytes]
    name_ids = np.r_[as_numpy(col.c_name).astype(np.int64), np.full(len(g_ts), -1)]
    return _Spans(ts, end, kind, coll, nbytes, name_ids, ts, 0)


def _cpu_comm(col: Collector) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Communication spans of a CPU run: gloo's transfers, named by the c10d ops that issued them.

    gloo runs some collectives as others (a reduce-scatter is an all-reduce of the
    whole buffer), so when the c10d ops and the gloo transfers pair up one to one
    (same count; both in issue order, gloo's queue is first in, first out) the
    c10d op gives the name and, where it knows it, the payload. Without gloo
    events the c10d ops themselves are the spans.
    """
    d_ts, d_end = as_numpy(col.d_ts), as_numpy(col.d_end)
    d_coll, d_bytes = as_numpy(col.d_coll).astype(np.int64), as_numpy(col.d_bytes)
    if len(col.g_ts) == 0:
        return d_ts, d_end, d_coll, d_bytes
    g_ts, g_end = as_numpy(col.g_ts), as_numpy(col.g_end)
    g_coll, g_bytes = as_numpy(col.g_coll).astype(np.int64), as_numpy(col.g_bytes)
    if len(d_ts) == len(g_ts):
        go, do = np.argsort(g_ts, kind="stable"), np.argsort(d_ts, kind="stable")
        g_ts, g_end, g_coll, g_bytes = g_ts[go], g_end[go], d_coll[do], g_bytes[go]
        known = d_bytes[do] >= 0
        g_bytes = np.where(known, d_bytes[do], g_bytes)
    return g_ts, g_end, g_coll, g_bytes


def _step_of(
    steps: list[tuple[int, float, float]], launch: np.ndarray, gpu: bool
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Each span's step index, whether it lies in a step at all, and the step numbers."""
    if not steps:
        return np.zeros(len(launch), dtype=np.int64), np.ones(len(launch), dtype=bool), [-1]
    starts = np.array([s[1] for s in steps])
    step_of = np.searchsorted(starts, launch, side="right") - 1
    inside = step_of >= 0
    step_end = np.array([s[2] for s in steps])
    if not gpu:  # CPU events after the last step's end belong to no step
        inside &= launch <= step_end[np.clip(step_of, 0, None)]
    return step_of, inside, [s[0] for s in steps]


def _add_collectives(
    per_coll: dict[int, list[float]],
    coll: np.ndarray,
    nbytes: np.ndarray,
    dur: np.ndarray,
    exposed: np.ndarray,
) -> None:
    """Add one step's collectives to the totals ``[count, bytes, time, exposed, all known]``."""
    for c, b, d, ex in zip(coll, nbytes, dur, exposed, strict=True):
        rec = per_coll[int(c)]
        rec[0] += 1
        rec[1] += max(int(b), 0)
        rec[2] += float(d)
        rec[3] += float(ex)
        if b < 0:
            rec[4] = 0


def _add_hot(hot: dict[int, list[float]], name_ids: np.ndarray, dur: np.ndarray) -> None:
    """Add one step's compute spans to the per-name totals ``[count, time]``."""
    if len(name_ids):
        uniq, inv = np.unique(name_ids, return_inverse=True)
        sums = np.bincount(inv, weights=dur)
        counts = np.bincount(inv)
        for u, tot, cnt in zip(uniq, sums, counts, strict=True):
            h = hot[int(u)]
            h[0] += int(cnt)
            h[1] += float(tot)


def _collective_stats(
    per_coll: dict[int, list[float]], coll_names: dict[int, str]
) -> list[CollectiveStats]:
    """Per collective, largest exposed time first."""
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
    return colls


def _compute_totals(
    hot: dict[int, list[float]], names: dict[int, str], n_steps: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The ten longest compute names, and compute time per step by ``compute_kind``."""
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
            by_kind[k] = by_kind.get(k, 0.0) + h[1] / 1e6 / max(1, n_steps)
    return compute_hot, dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))


def summarize_rank(
    path: Path,
    rank: int,
    meta: dict[str, Any],
    col: Collector,
    n_events: int,
    shift_us: float,
) -> RankProfile:
    """The rank's profile from what ``scan_trace`` kept; times shifted by ``shift_us``."""
    steps = sorted(col.steps)
    gpu = len(col.k_ts) > 0
    sp = _gpu_spans(col) if gpu else _cpu_spans(col)
    step_of, inside, step_ids = _step_of(steps, sp.launch, gpu)
    results: list[StepStats] = []
    lanes: dict[int, dict[str, list[list[float]]]] = {}
    per_coll: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0, 1])
    hot: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
    gpu_first = []
    for k in range(len(step_ids)):
        m = inside & (step_of == k)
        gpu_first.append(float(sp.ts[m].min()) if m.any() else None)
    for k, step_id in enumerate(step_ids):
        m = inside & (step_of == k)
        if not m.any():
            continue
        s, e, kd = sp.ts[m], sp.end[m], sp.kind[m]
        window = step_window(k, gpu=gpu, steps=steps, gpu_first=gpu_first, s=s, e=e)
        stats, lanes[step_id], exposed_each = measure_step(
            step_id, s, e, kd, sp.nbytes[m], window, shift_us
        )
        results.append(stats)
        cm = kd == 1
        _add_collectives(per_coll, sp.coll[m][cm], sp.nbytes[m][cm], e[cm] - s[cm], exposed_each)
        _add_hot(hot, sp.name_ids[m][kd == 0], (e - s)[kd == 0])
    compute_hot, by_kind = _compute_totals(hot, {i: n for n, i in col.names.items()}, len(results))
    parlab_meta = meta.get("parlab") if isinstance(meta.get("parlab"), dict) else {}
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    return RankProfile(
        path=str(path),
        rank=rank,
        world_size=world_of(meta),
        run_id=parlab_meta.get("run_id"),
        label=parlab_meta.get("label"),
        project=parlab_meta.get("project"),
        backend=info.get("backend"),
        device="cuda" if gpu else "cpu",
        events=n_events,
        steps=results,
        collectives=_collective_stats(per_coll, {i: n for n, i in col.coll_names.items()}),
        lanes=lanes,
        compute_hotspots=compute_hot,
        compute_by_kind=by_kind,
        unlaunched_kernels=sp.unlaunched,
    )
