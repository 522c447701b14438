"""parlab.report: a results folder as one self-contained HTML file and a Markdown twin.

Built from ``distributed-benchmark/v1`` documents ALONE (``read_results``), so
any report can be rebuilt from the results folder: the asset table, then per
project its figures (one evidence level per figure), its predicted-against-
measured table, and every baseline / candidate / failure / decision document
with its metrics, failure, decision, notes and artifacts (PNG artifacts are
embedded). Nothing crosses any wire; nothing is measured here.

``build_report(results_dir, out_dir)`` writes ``report.html`` (images as
base64 data URIs, no script, nothing fetched) and ``report.md`` (images in
``report_files/`` beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parlab.contract import atomic_write_text, now_iso, read_results
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
    """Figures drawn from metrics (artifacts not counted)."""
    run_ids: tuple[str, ...]
    """Every document included."""


def build_report(results_dir: str | Path, out_dir: str | Path | None = None) -> ReportOutcome:
    """Render ``results_dir`` into ``out_dir`` (default ``<results_dir>/report``)."""
    from parlab.report.render import build_blocks, to_html, to_markdown

    root = Path(results_dir)
    entries, skipped = read_results(root)
    out = Path(out_dir) if out_dir is not None else root / "report"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a folder for the report")
    out.mkdir(parents=True, exist_ok=True)
    rep = build_blocks(entries, skipped, root=root, out_dir=out, generated=now_iso())
    html_path = out / "report.html"
    atomic_write_text(html_path, to_html(rep))
    md, files = to_markdown(rep)
    for name, data in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    md_path = out / "report.md"
    atomic_write_text(md_path, md)
    return ReportOutcome(
        html=html_path,
        markdown=md_path,
        documents=len(entries),
        skipped=len(skipped),
        figures=len(rep.figures),
        run_ids=tuple(rep.run_ids),
    )


__all__ = ["ReportOutcome", "build_report"]
