"""parlab.report: a results folder as one self-contained HTML page and a Markdown twin.

Built from ``distributed-benchmark/v1`` documents alone (``read_results``), so any report
can be rebuilt from the results folder. The page answers first -- per project the question,
baseline, candidates, failures and decision, each with its numbers, evidence level and links
to its documents -- then shows one figure per question, and ends with the asset table, folded.
Nothing crosses any wire; nothing is measured here.

``build_report(results_dir, out_dir)`` writes ``report.html`` (figures as inline SVG, no
script, nothing fetched) and ``report.md`` (figures in ``report_files/`` beside it). A folder
with no readable document is bad input (``UsageError``): nothing is written.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

from parlab.contract import Entry, Skipped, atomic_write_text, now_iso, read_results
from parlab.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class ReportOutcome:
    """What ``build_report`` wrote."""

    html: Path
    """The self-contained HTML file."""
    markdown: Path
    """The Markdown version."""
    documents: int
    """Documents included."""
    skipped: int
    """Files under the results folder that are not readable documents."""
    figures: int
    """Figures drawn."""
    run_ids: tuple[str, ...]
    """Every document included."""


def build_report(results_dir: str | Path, out_dir: str | Path | None = None) -> ReportOutcome:
    """Render ``results_dir`` into ``out_dir`` (default ``<results_dir>/report``)."""
    root = Path(results_dir)
    frozen = gc.isenabled()  # read_results freezes only a running collector
    entries, skipped = read_results(root, freeze=True)
    try:
        return _build(root, entries, skipped, out_dir)
    finally:
        if frozen:
            gc.unfreeze()  # the documents back to the collector


def _build(
    root: Path, entries: list[Entry], skipped: list[Skipped], out_dir: str | Path | None
) -> ReportOutcome:
    """``build_report`` once the folder is read."""
    from parlab.report.html import to_html  # lazy: parlab.report.html
    from parlab.report.markdown import write_markdown  # lazy: parlab.report.markdown
    from parlab.report.render import build_blocks  # lazy: parlab.report.render

    if not entries:
        why = (
            f"{len(skipped)} JSON file(s), none a readable document (first: {skipped[0].path}: "
            f"{skipped[0].reason})"
            if skipped
            else "no JSON document"
        )
        raise UsageError(
            f"nothing to report in {root}: {why}; run a parlab command there first "
            "(parlab demo) or pass the folder that holds the documents"
        )
    out = Path(out_dir) if out_dir is not None else root / "report"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a folder for the report")
    out.mkdir(parents=True, exist_ok=True)
    rep = build_blocks(entries, skipped, root=root, out_dir=out, generated=now_iso())
    write_markdown(rep, out / "report.md")
    atomic_write_text(out / "report.html", to_html(rep))
    return ReportOutcome(
        html=out / "report.html",
        markdown=out / "report.md",
        documents=len(entries),
        skipped=len(skipped),
        figures=len(rep.figures),
        run_ids=tuple(rep.run_ids),
    )


__all__ = ["ReportOutcome", "build_report"]
