"""The case collection: why a multi-GPU run is not faster, as data (one registry, ``CASES``).

Each ``Case`` is a symptom, the document fields that show it, a detector, the
explanation and what to try. A detector reads contract documents only (what
``parlab`` commands wrote) and returns ``Finding`` objects naming the document,
the fields and the numbers it used, with a strength:

- ``strong``: a measured number crosses the case's threshold *and* a second
  measurement agrees (a healthy twin in the same sweep, or a setting that
  explains it);
- ``moderate``: one measured number crosses the threshold;
- ``weak``: a hint only (an analytic estimate, a setting without a measurement,
  a ratio close to the threshold, or a run too small to tell).

Nothing here crosses the wire: detectors are pure functions of the documents.
Thresholds are named constants so the docs and the tests read the same numbers.

One module per case family, each holding its thresholds, detectors and ``Case`` entries:
``communication``, ``idle``, ``memory``, ``cluster``, ``serving``; ``base`` holds what every
case is made of. ``CASES`` lists them in that order.
"""

from parlab.doctor.cases import cluster, communication, idle, memory, serving
from parlab.doctor.cases.base import Case, Detector, Doc, Finding

CASES: list[Case] = [
    *communication.CASES,
    *idle.CASES,
    *memory.CASES,
    *cluster.CASES,
    *serving.CASES,
]
"""Every case, in the order ``parlab doctor`` lists them."""

BY_ID: dict[str, Case] = {c.id: c for c in CASES}

__all__ = ["BY_ID", "CASES", "Case", "Detector", "Doc", "Finding"]
