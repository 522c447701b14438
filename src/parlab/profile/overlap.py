"""One step's arithmetic: its window, lanes, compute, communication, overlap, exposed and idle.

Holistic Trace Analysis's definitions (see ``parlab.profile.analyze``): overlap is
|comm ∩ compute|, exposed communication |comm| − overlap, idle the window minus everything the
device ran; each collective's exposed share is the part of its span no compute covers, scaled
so that concurrent collectives add up to the step's exposed communication.
"""

from __future__ import annotations

import numpy as np

from parlab.profile import intervals as iv
from parlab.profile.profiles import StepStats


def step_window(
    k: int,
    *,
    gpu: bool,
    steps: list[tuple[int, float, float]],
    gpu_first: list[float | None],
    s: np.ndarray,
    e: np.ndarray,
) -> tuple[float, float]:
    """Step ``k``'s window (microseconds) given its spans ``s``..``e``.

    GPU: from its first kernel to the next step's first kernel (the last step: for its CPU
    step's length, or to its last kernel's end if that is later). CPU: the step mark's span;
    without step marks, the whole trace.
    """
    if gpu:
        lo = gpu_first[k]
        assert lo is not None  # the step has spans
        nxt = next((f for f in gpu_first[k + 1 :] if f is not None), None)
        if nxt is not None:
            return lo, nxt
        # the last step: its CPU step's length, or its last kernel if later
        cpu_len = steps[k][2] - steps[k][1] if steps else 0.0
        return lo, max(float(e.max()), lo + cpu_len)
    if steps:
        return steps[k][1], steps[k][2]
    return float(s.min()), float(e.max())  # no step marks: the whole trace is one step


def measure_step(
    step_id: int,
    s: np.ndarray,
    e: np.ndarray,
    kd: np.ndarray,
    nbytes: np.ndarray,
    window: tuple[float, float],
    shift_us: float,
) -> tuple[StepStats, dict[str, list[list[float]]], np.ndarray]:
    """One step's figures, its lanes and each collective's exposed share (microseconds).

    ``s``, ``e``, ``kd``, ``nbytes``: the step's spans, kind codes (0 compute, 1 comm,
    2 memory) and payloads (-1 unknown); the shares follow the order of ``s[kd == 1]``.
    """
    lo, hi = window
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
    stats = StepStats(
        step=step_id,
        window_s=(hi - lo) / 1e6,
        compute_s=iv.measure(comp) / 1e6,
        comm_s=comm_t / 1e6,
        overlap_s=overlap / 1e6,
        exposed_s=max(comm_t - overlap, 0.0) / 1e6,
        idle_s=max(hi - lo - busy_in, 0.0) / 1e6,
        comm_count=int(cm.sum()),
        comm_bytes=int(np.clip(nbytes[cm], 0, None).sum()),
        last_comm_start_us=float(cs.max()) + shift_us if len(cs) else None,
    )
    lanes = {
        "compute": _spans_list(comp, shift_us),
        "comm": _spans_list(comm, shift_us),
        "memory": _spans_list(mem, shift_us),
        "window": [[lo + shift_us, hi + shift_us]],
    }
    return stats, lanes, exposed_each


def _spans_list(spans: iv.Spans, shift: float, limit: int = 20000) -> list[list[float]]:
    """Merged spans as ``[start_us, end_us]`` pairs on the shared clock, at most ``limit``."""
    s, e = spans
    if len(s) > limit:  # keep the timeline drawable: merge the smallest gaps away
        gaps = s[1:] - e[:-1]
        cut = np.sort(gaps)[len(gaps) - limit]
        keep = np.r_[True, gaps >= cut]
        idx = np.flatnonzero(keep)
        e = np.r_[e[idx[1:] - 1], e[-1]]
        s = s[idx]
    return [[float(a) + shift, float(b) + shift] for a, b in zip(s, e, strict=True)]
