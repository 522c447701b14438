"""The doctor's answer as text: the cases found, ranked, first; then each case's evidence.

Cases are ranked by their strongest finding (strong, moderate, weak), then by the
evidence behind it (GPU measurements before CPU mechanisms and formulas), then by
how many documents show them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from parlab.doctor.cases import BY_ID, CASES, Finding
from parlab.doctor.diagnose import STRENGTH_ORDER, Diagnosis, diagnose

LEVEL_ORDER = {
    "real-training": 0, "real-nccl": 0, "serving-benchmark": 0, "env-precheck": 1,
    "cpu-mechanism": 2, "analytic": 3,
}  # fmt: skip


def _key(f: Finding) -> tuple[int, int]:
    return STRENGTH_ORDER[f.strength], LEVEL_ORDER.get(f.evidence_level, 4)


def ranked_cases(diag: Diagnosis) -> list[tuple[str, Finding, int]]:
    """(case id, its strongest finding, how many findings) for each case found, best first."""
    out = []
    for cid in diag.cases_found():
        rows = sorted((f for f in diag.findings if f.case == cid), key=_key)
        out.append((cid, rows[0], len(rows)))
    out.sort(key=lambda r: (*_key(r[1]), -r[2]))
    return out


def print_diagnosis(diag: Diagnosis, out: Console, *, show_help: bool = True) -> None:
    """The ranked findings, then each case's table, fields and advice."""
    ranked = ranked_cases(diag)
    out.print(
        f"parlab doctor: {escape(str(diag.results))} -- {diag.documents} documents, "
        f"{diag.cases_checked} cases checked, {len(ranked)} found "
        f"({len(diag.findings)} findings)"
    )
    if not ranked:
        out.print(
            f"nothing found: none of the {diag.cases_checked} cases shows in these "
            f"{diag.documents} documents"
        )
    else:
        out.print("findings, ranked (the strongest evidence of each case):")
        for i, (cid, f, n) in enumerate(ranked, 1):
            out.print(
                f"  {i}. [bold]{cid}[/bold] ({escape(BY_ID[cid].title)}): {f.strength}, "
                f"{f.evidence_level}, {n} finding{'s' if n > 1 else ''} -- {escape(f.summary)}"
            )
    for s in diag.skipped:
        out.print(f"  skipped (not a document): {escape(s)}")
    for cid, _, _ in ranked:
        _print_case(diag, cid, out, show_help=show_help)
    found = {c for c, _, _ in ranked}
    rest = [c.id for c in CASES if c.id not in found]
    if ranked:
        out.print(f"not shown by these documents: {', '.join(rest) or 'none'}")


def _print_case(diag: Diagnosis, cid: str, out: Console, *, show_help: bool) -> None:
    case = BY_ID[cid]
    out.rule(escape(f"{cid}: {case.title}"))
    table = Table(show_lines=False, expand=False)
    for col in ("strength", "evidence", "document", "what the fields say"):
        table.add_column(col, overflow="fold")
    rows = sorted((f for f in diag.findings if f.case == cid), key=_key)
    for f in rows:
        table.add_row(f.strength, f.evidence_level, escape(f.document), escape(f.summary))
    out.print(table)
    for f in rows:
        out.print(f"  fields ({escape(f.document.rsplit('/', 1)[-1])}):")
        for fld in f.fields:
            out.print(f"    {escape(fld)}")
    if not show_help:
        return
    out.print(f"  [bold]why[/bold]: {escape(case.explanation)}")
    out.print(f"  [bold]try[/bold]: {escape(case.try_)}")
    if case.reproduce != "none":
        out.print(
            f"  [bold]reproduce[/bold]: parlab doctor --reproduce {cid} "
            f"({case.reproduce}: {escape(case.reproduce_note)})"
        )
    if case.terms:
        out.print(
            "  [bold]terms[/bold]: "
            + ", ".join(f"parlab explain {escape(repr(t))}" for t in case.terms)
        )


def demo_step(results: Path, console: Any) -> None:
    """``parlab demo``: the doctor over the demo's results folder (reads only; writes nothing)."""
    print_diagnosis(diagnose(results), console, show_help=False)
