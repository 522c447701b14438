"""What every case is made of: the documents the detectors read, the findings, the ``Case`` entry,
and the small readers the detectors share (metric values, field lines, strength-tagged findings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from parlab.contract import Document
from parlab.units import format_bytes, format_seconds


@dataclass(frozen=True, kw_only=True)
class Doc:
    """A document as the detectors see it."""

    path: str
    """Its path relative to the results folder (what a finding cites)."""
    doc: Document
    """The parsed document."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One case shown by one document (or one pair of documents)."""

    case: str
    """The case id."""
    document: str
    """The document that shows it, relative to the results folder."""
    fields: list[str]
    """The fields read, each as ``field = value``."""
    strength: str
    """``strong``, ``moderate`` or ``weak`` (see the module docstring)."""
    summary: str
    """One line with the numbers."""
    evidence_level: str
    """The document's evidence level."""
    twins: list[str] = field(default_factory=list)
    """Other documents the finding compares with."""

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "document": self.document,
            "fields": list(self.fields),
            "strength": self.strength,
            "summary": self.summary,
            "evidence_level": self.evidence_level,
            "twins": list(self.twins),
        }


Detector = Callable[[list[Doc]], list[Finding]]


@dataclass(frozen=True, kw_only=True)
class Case:
    """One entry of the case collection."""

    id: str
    """Short id (``parlab doctor --reproduce ID``)."""
    title: str
    """The case in a few words."""
    symptom: str
    """What the user sees."""
    evidence: str
    """Which documents and fields show it."""
    explanation: str
    """Why it happens."""
    try_: str
    """What to try."""
    detector: Detector
    """Documents -> findings."""
    reproduce: str
    """``cpu``, ``gpu`` or ``none`` (where the reproduction runs)."""
    reproduce_note: str = ""
    """What the reproduction runs (or why there is none)."""
    terms: tuple[str, ...] = ()
    """Glossary terms that explain it (``parlab explain TERM``)."""
    gpu_timing: bool = False
    """True: only GPU documents are judged (on gloo CPU ranks comm and compute share the
    cores, so overlap and lateness say nothing about GPUs)."""


def mval(doc: Document, name: str) -> float | None:
    """Metric ``name``'s value as a float (None: absent or unknown)."""
    m = doc.metrics.get(name)
    return None if m is None or m.value is None else float(m.value)


def mper(doc: Document, name: str) -> list[float] | None:
    """Metric ``name``'s per-rank values (None: absent)."""
    m = doc.metrics.get(name)
    if m is None or m.per_rank is None:
        return None
    return [float(v) for v in m.per_rank if v is not None]


def fmt(v: float, unit: str = "") -> str:
    """``v`` as the findings print it: bytes, seconds, GB/s, or 4 significant digits."""
    if unit == "B":
        return format_bytes(v)
    if unit == "s":
        return format_seconds(v)
    if unit == "B/s":
        return f"{v / 1e9:.1f} GB/s"
    return f"{v:.4g}{(' ' + unit) if unit else ''}"


def mfield(d: Doc, name: str) -> str:
    """The ``metrics.<name>.value = ...`` line a finding cites."""
    m = d.doc.metrics[name]
    return f"metrics.{name}.value = {fmt(float(m.value), m.unit) if m.value is not None else None}"


def finding(d: Doc, case: str, strength: str, summary: str, fields: Iterable[str],
             twins: Iterable[str] = ()) -> Finding:  # fmt: skip
    return Finding(
        case=case,
        document=d.path,
        fields=list(fields),
        strength=strength,
        summary=summary,
        evidence_level=d.doc.evidence_level,
        twins=list(twins),
    )


def ok_docs(docs: list[Doc]) -> list[Doc]:
    """The documents of runs that succeeded."""
    return [d for d in docs if d.doc.status == "ok"]


def sweep_group(d: Doc, docs: list[Doc]) -> list[Doc]:
    """The documents of the same profile sweep (``workload.sweep_run_id``)."""
    sid = d.doc.workload.get("sweep_run_id")
    if not sid:
        return []
    return [o for o in ok_docs(docs) if o is not d and o.doc.workload.get("sweep_run_id") == sid]
