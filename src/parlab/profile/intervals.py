"""Interval arithmetic on time spans (numpy arrays of starts and ends, microseconds).

The overlap figures are measures of unions and intersections:
``union`` merges overlapping spans, ``measure`` is the total length,
``covered`` is, for each span, how much of it a union covers. No process
group, no I/O.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Spans = tuple[NDArray[np.float64], NDArray[np.float64]]
"""(starts, ends) of the same length, ends >= starts."""


def empty() -> Spans:
    return np.zeros(0), np.zeros(0)


def union(starts: NDArray[np.float64], ends: NDArray[np.float64]) -> Spans:
    """Merge overlapping or touching spans; the result is sorted and disjoint."""
    if len(starts) == 0:
        return empty()
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    e = np.asarray(ends, dtype=np.float64)[order]
    run_end = np.maximum.accumulate(e)
    # a new merged span starts where the start passes every end seen before it
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    merged_s = s[idx]
    last = np.r_[idx[1:] - 1, len(s) - 1]
    merged_e = run_end[last]
    return merged_s, merged_e


def measure(spans: Spans) -> float:
    """Total length of disjoint spans."""
    return float(np.sum(spans[1] - spans[0]))


def covered(
    starts: NDArray[np.float64], ends: NDArray[np.float64], by: Spans
) -> NDArray[np.float64]:
    """For each span ``[starts[i], ends[i]]``, the length that the disjoint spans ``by`` cover."""
    us, ue = by
    if len(us) == 0 or len(starts) == 0:
        return np.zeros(len(starts))
    cum = np.r_[0.0, np.cumsum(ue - us)]

    def upto(x: NDArray[np.float64]) -> NDArray[np.float64]:
        # measure of by ∩ (-inf, x]
        i = np.searchsorted(us, x, side="right")  # spans starting at or before x
        j = np.maximum(i - 1, 0)
        part = np.clip(x - us[j], 0.0, ue[j] - us[j])
        return np.where(i > 0, cum[j] + part, 0.0)

    return upto(np.asarray(ends, dtype=np.float64)) - upto(np.asarray(starts, dtype=np.float64))


def intersection(a: Spans, b: Spans) -> float:
    """Length of the intersection of two disjoint-span sets."""
    return float(np.sum(covered(a[0], a[1], b)))


def clip(spans: Spans, lo: float, hi: float) -> Spans:
    """The parts of disjoint spans that lie inside ``[lo, hi]``."""
    s = np.clip(spans[0], lo, hi)
    e = np.clip(spans[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]
