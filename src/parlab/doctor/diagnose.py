"""``diagnose(results_dir)``: run every case's detector over a results folder.

Reads contract documents only (``parlab.contract.read_results``); launches
nothing, writes nothing. An empty folder or one without a single
``distributed-benchmark/v1`` document is bad input (``UsageError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.contract import read_results
from parlab.doctor.cases import BY_ID, CASES, Doc, Finding
from parlab.errors import UsageError

STRENGTH_ORDER = {"strong": 0, "moderate": 1, "weak": 2}


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """What the doctor found in one results folder."""

    results: Path
    """The folder read."""
    documents: int
    """Documents read."""
    skipped: list[str]
    """Files that are not documents (``path: why``)."""
    findings: list[Finding] = field(default_factory=list)
    """Every finding, grouped by case in collection order, strongest first within a case."""
    cases_checked: int = len(CASES)
    """How many cases were checked."""

    def cases_found(self) -> list[str]:
        seen: list[str] = []
        for f in self.findings:
            if f.case not in seen:
                seen.append(f.case)
        return seen

    def to_json(self) -> dict[str, Any]:
        return {
            "results": str(self.results),
            "documents": self.documents,
            "skipped": list(self.skipped),
            "cases_checked": self.cases_checked,
            "cases_found": self.cases_found(),
            "findings": [f.to_json() for f in self.findings],
        }


def load(results: Path) -> tuple[list[Doc], list[str]]:
    """The documents under ``results`` and the files skipped; ``UsageError`` if none."""
    results = Path(results)
    if not results.is_dir():
        raise UsageError(f"results folder {results} does not exist: give a folder that parlab "
                         "commands wrote (e.g. results/ or parlab-results/)")  # fmt: skip
    entries, skipped = read_results(results, nested=True)
    if not entries:
        what = f"{len(skipped)} foreign file(s)" if skipped else "nothing"
        raise UsageError(
            f"{results} holds no distributed-benchmark/v1 documents ({what}): run parlab "
            "commands (or `parlab demo`) first, or pass the folder they wrote"
        )
    docs = [Doc(path=str(e.path.relative_to(results)), doc=e.doc) for e in entries]
    return docs, [f"{s.path}: {s.reason}" for s in skipped]


def diagnose(results: Path, *, cases: list[str] | None = None) -> Diagnosis:
    """Run the detectors (all, or the ``cases`` ids) over the documents in ``results``."""
    docs, skipped = load(results)
    chosen = [BY_ID[c] for c in cases] if cases else CASES
    order = {c.id: i for i, c in enumerate(CASES)}
    findings: list[Finding] = []
    gpu_docs = [d for d in docs if d.doc.evidence_level != "cpu-mechanism"]
    for case in chosen:
        findings.extend(case.detector(gpu_docs if case.gpu_timing else docs))
    findings.sort(key=lambda f: (order[f.case], STRENGTH_ORDER[f.strength], f.document))
    return Diagnosis(
        results=Path(results),
        documents=len(docs),
        skipped=skipped,
        findings=findings,
        cases_checked=len(chosen),
    )
