"""The report as blocks, then as self-contained HTML and as Markdown.

``build_blocks`` turns a results folder's documents into a list of blocks
(headings, paragraphs, tables, images); ``to_html`` and ``to_markdown`` render
the same blocks, so the two versions always say the same thing. HTML embeds
every image as a base64 PNG and uses no script, stylesheet or font from
anywhere else: the file opens alone, offline. Markdown references the PNGs
written beside it in ``report_files/``.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from parlab.contract import PROJECTS, ROLES, Document, Entry, Skipped, headline
from parlab.report.figures import Figure, prediction_pairs, project_figures
from parlab.report.format import (
    LEVEL_COLOUR,
    LEVEL_MEANING,
    fmt_error,
    fmt_metric,
    fmt_per_rank,
    fmt_value,
    gpu_summary,
    layout_label,
    relative_error,
    scalar_items,
)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg")


@dataclass(frozen=True, kw_only=True)
class Heading:
    """A section title."""

    depth: int
    """1 (report title) to 4."""
    text: str
    """The title."""
    anchor: str = ""
    """HTML id, for the table of contents."""
    level: str | None = None
    """An evidence level to show as a badge beside the title."""


@dataclass(frozen=True, kw_only=True)
class Para:
    """A paragraph of plain text."""

    text: str
    """The text."""
    level: str | None = None
    """An evidence level to show as a badge before the text."""
    code: bool = False
    """Show as code (commands)."""


@dataclass(frozen=True, kw_only=True)
class Table:
    """A table of plain-text cells."""

    headers: list[str]
    """Column titles."""
    rows: list[list[str]]
    """Cells."""
    level_column: int | None = None
    """Index of a column holding evidence levels (shown as badges)."""


@dataclass(frozen=True, kw_only=True)
class Image:
    """An embedded image (a figure of the report, or a document's artifact)."""

    key: str
    """File-safe name (Markdown writes ``report_files/<key><suffix>``)."""
    title: str
    """Alt text and title."""
    caption: str
    """Shown under it; names the evidence level."""
    data: bytes
    """The image bytes."""
    suffix: str = ".png"
    """File type."""
    level: str | None = None
    """The evidence level of what it shows."""


@dataclass(frozen=True, kw_only=True)
class Bullets:
    """A bulleted list."""

    items: list[str]
    """The items."""


Block = Heading | Para | Table | Image | Bullets


@dataclass(kw_only=True)
class Report:
    """The blocks of a report and what went in."""

    title: str
    """The report title."""
    blocks: list[Block] = field(default_factory=list)
    """Everything, in order."""
    figures: list[Figure] = field(default_factory=list)
    """The figures drawn from metrics (artifacts not included)."""
    run_ids: list[str] = field(default_factory=list)
    """Every document included."""


def _anchor(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _status(doc: Document) -> str:
    if doc.failure is not None:
        rank = "" if doc.failure.rank is None else f", rank {doc.failure.rank}"
        return f"failed ({doc.failure.kind}{rank})"
    return doc.status


def _asset_table(entries: Sequence[Entry], root: Path) -> Table:
    rows = []
    for e in entries:
        d = e.doc
        h = headline(d)
        try:
            rel = str(e.path.relative_to(root))
        except ValueError:
            rel = str(e.path)
        rows.append(
            [
                d.project,
                d.task,
                d.role,
                d.evidence_level,
                _status(d),
                f"{h[0]} = {fmt_metric(h[1])}" if h else "-",
                d.run_id,
                d.created,
                rel,
            ]
        )
    return Table(
        headers=[
            "project",
            "task",
            "role",
            "evidence",
            "status",
            "headline",
            "run_id",
            "created",
            "path",
        ],
        rows=rows,
        level_column=3,
    )


def _prediction_table(docs: Sequence[Document]) -> Table | None:
    rows = []
    for d in docs:
        for name, pred, meas, unit, model in prediction_pairs(d):
            rows.append(
                [
                    d.run_id,
                    d.evidence_level,
                    name,
                    fmt_value(pred, unit),
                    fmt_value(meas, unit) if meas is not None else "not measured",
                    fmt_error(relative_error(pred, meas)),
                    model,
                ]
            )
    if not rows:
        return None
    return Table(
        headers=[
            "run_id",
            "measured at",
            "metric",
            "predicted (analytic)",
            "measured",
            "error",
            "model",
        ],
        rows=rows,
        level_column=1,
    )


def _artifact_blocks(entry: Entry, out_dir: Path) -> list[Block]:
    doc = entry.doc
    if not doc.artifacts:
        return []
    blocks: list[Block] = []
    listed: list[str] = []
    for name, rel in doc.artifacts.items():
        path = (entry.path.parent / rel).resolve()
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
            blocks.append(
                Image(
                    key=_anchor(f"{doc.run_id}-{name}"),
                    title=f"{doc.run_id}: {name}",
                    caption=f"Artifact {name!r} of {doc.run_id} ({rel}); evidence level: "
                    f"{doc.evidence_level}.",
                    data=path.read_bytes(),
                    suffix=path.suffix.lower(),
                    level=doc.evidence_level,
                )
            )
        else:
            where = os.path.relpath(path, out_dir) if path.exists() else f"{rel} (missing)"
            listed.append(f"{name}: {where}")
    if listed:
        blocks.insert(0, Bullets(items=[f"artifact {x}" for x in listed]))
    return blocks


def _document_blocks(entry: Entry, out_dir: Path) -> list[Block]:
    d = entry.doc
    blocks: list[Block] = [
        Heading(
            depth=4,
            text=f"{d.run_id} ({_status(d)})",
            anchor=_anchor(d.run_id),
            level=d.evidence_level,
        ),
        Para(
            text=f"{d.role} · task {d.task} · evidence level {d.evidence_level} · "
            f"{gpu_summary(d.environment)} · world size {d.layout.get('world_size')} · "
            f"layout {layout_label(d.layout)} · created {d.created}",
            level=d.evidence_level,
        ),
        Para(text=d.command, code=True),
    ]
    if d.failure is not None:
        blocks.append(
            Para(
                text=f"FAILED: {d.failure.kind}"
                + ("" if d.failure.rank is None else f" on rank {d.failure.rank}")
                + f": {d.failure.message}"
            )
        )
    if d.decision is not None:
        dec = d.decision
        blocks.append(Para(text=f"Decision: chosen {dec.chosen or 'none'}. {dec.reason}".strip()))
        if dec.rejected:
            blocks.append(
                Table(
                    headers=["rejected", "reason"],
                    rows=[[r.get("candidate", "?"), r.get("reason", "")] for r in dec.rejected],
                )
            )
        blocks.append(Para(text="Rests on: " + (", ".join(dec.rests_on) or "nothing")))
    items = scalar_items(d.workload)
    if items:
        blocks.append(Para(text="Workload: " + "; ".join(f"{k} = {v}" for k, v in items)))
    if d.metrics:
        rows = [
            [name, fmt_metric(m), m.unit, fmt_per_rank(m), d.evidence_level]
            for name, m in d.metrics.items()
        ]
        blocks.append(
            Table(
                headers=["metric", "value", "unit", "per rank", "evidence"],
                rows=rows,
                level_column=4,
            )
        )
    if d.notes:
        blocks.append(Bullets(items=list(d.notes)))
    blocks += _artifact_blocks(entry, out_dir)
    return blocks


def build_blocks(
    entries: Sequence[Entry],
    skipped: Sequence[Skipped],
    *,
    root: Path,
    out_dir: Path,
    generated: str,
) -> Report:
    """The whole report for ``entries`` (a results folder's documents, oldest first)."""
    rep = Report(title=f"parlab report: {root}")
    b = rep.blocks
    b.append(Heading(depth=1, text=rep.title, anchor="top"))
    levels = Counter(e.doc.evidence_level for e in entries)
    b.append(
        Para(
            text=f"Generated {generated} from the {len(entries)} distributed-benchmark/v1 "
            f"document(s) under {root} alone"
            + (f" ({len(skipped)} file(s) skipped, listed below)" if skipped else "")
            + ". Evidence levels present: "
            + (", ".join(f"{lvl} ({n})" for lvl, n in sorted(levels.items())) or "none")
            + ". Every figure holds one evidence level and every table names the level of "
            "each row: levels are never mixed silently."
        )
    )
    b.append(Heading(depth=2, text="Evidence levels", anchor="evidence-levels"))
    b.append(
        Table(
            headers=["level", "meaning", "documents"],
            rows=[[lvl, LEVEL_MEANING[lvl], str(levels.get(lvl, 0))] for lvl in LEVEL_MEANING],
            level_column=0,
        )
    )
    b.append(Heading(depth=2, text="Asset table", anchor="asset-table"))
    if entries:
        b.append(_asset_table(entries, root))
    else:
        b.append(Para(text="No documents: run a parlab command first (parlab demo)."))
    if skipped:
        b.append(Heading(depth=3, text="Skipped files", anchor="skipped"))
        b.append(Bullets(items=[f"{s.path}: {s.reason}" for s in skipped]))
    rep.run_ids = [e.doc.run_id for e in entries]
    present = [p for p in PROJECTS if any(e.doc.project == p for e in entries)]
    for project in present:
        group = [e for e in entries if e.doc.project == project]
        docs = [e.doc for e in group]
        b.append(Heading(depth=2, text=project, anchor=_anchor(project)))
        roles = Counter(d.role for d in docs)
        b.append(
            Para(
                text=f"{len(docs)} document(s): "
                + ", ".join(f"{roles[r]} {r}" for r in ROLES if roles[r])
                + "; levels: "
                + ", ".join(sorted({d.evidence_level for d in docs}))
                + "."
            )
        )
        figs = project_figures(project, docs, _anchor(project))
        rep.figures += figs
        if figs:
            b.append(Heading(depth=3, text="Figures", anchor=_anchor(f"{project}-figures")))
            for f in figs:
                b.append(
                    Image(key=f.key, title=f.title, caption=f.caption, data=f.png, level=f.level)
                )
        pt = _prediction_table(docs)
        b.append(
            Heading(depth=3, text="Predicted against measured", anchor=_anchor(f"{project}-pvm"))
        )
        if pt is not None:
            b.append(
                Para(
                    text="Each prediction is what an analytic model (named in the last column) "
                    "said before the run; error = (predicted - measured) / measured."
                )
            )
            b.append(pt)
        else:
            b.append(Para(text="No document of this project carries predictions."))
        for role in ROLES:
            in_role = [e for e in group if e.doc.role == role]
            if not in_role:
                continue
            b.append(
                Heading(
                    depth=3, text=f"{role} ({len(in_role)})", anchor=_anchor(f"{project}-{role}")
                )
            )
            for e in in_role:
                b += _document_blocks(e, out_dir)
    return rep


# ----- HTML ---------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#111;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;margin-top:2em}h4{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0;font-size:.85em}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f4f6}code,pre{background:#f3f4f6;padding:2px 4px;font-size:.85em;
white-space:pre-wrap;word-break:break-all}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:0 6px;font-size:.8em;
margin-right:4px;white-space:nowrap}figure{margin:1em 0}figcaption{font-size:.85em;color:#444}
img{max-width:100%;border:1px solid #eee}nav{font-size:.9em}
"""


def _badge(level: str) -> str:
    colour = LEVEL_COLOUR.get(level, "#444")
    return f'<span class="badge" style="background:{colour}">{html.escape(level)}</span>'


def _data_uri(data: bytes, suffix: str) -> str:
    mime = mimetypes.types_map.get(suffix, "image/png")
    if suffix == ".svg":
        mime = "image/svg+xml"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def to_html(rep: Report) -> str:
    """Self-contained HTML: inline CSS, images as data URIs, no script."""
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(rep.title)}</title><style>{_CSS}</style></head><body>",
    ]
    toc = [blk for blk in rep.blocks if isinstance(blk, Heading) and blk.depth == 2]
    for blk in rep.blocks:
        if isinstance(blk, Heading):
            badge = _badge(blk.level) if blk.level else ""
            anchor = f' id="{e(blk.anchor)}"' if blk.anchor else ""
            out.append(f"<h{blk.depth}{anchor}>{e(blk.text)} {badge}</h{blk.depth}>")
            if blk.depth == 1 and toc:
                links = " · ".join(f'<a href="#{e(h.anchor)}">{e(h.text)}</a>' for h in toc)
                out.append(f"<nav>{links}</nav>")
        elif isinstance(blk, Para):
            if blk.code:
                out.append(f"<p><code>{e(blk.text)}</code></p>")
            else:
                badge = _badge(blk.level) if blk.level else ""
                out.append(f"<p>{badge}{e(blk.text)}</p>")
        elif isinstance(blk, Table):
            out.append("<table><thead><tr>")
            out += [f"<th>{e(h)}</th>" for h in blk.headers]
            out.append("</tr></thead><tbody>")
            for row in blk.rows:
                cells = [
                    _badge(c) if i == blk.level_column and c in LEVEL_COLOUR else e(c)
                    for i, c in enumerate(row)
                ]
                out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            out.append("</tbody></table>")
        elif isinstance(blk, Image):
            badge = _badge(blk.level) if blk.level else ""
            out.append(
                f'<figure id="fig-{e(blk.key)}"><img alt="{e(blk.title)}" title="{e(blk.title)}" '
                f'src="{_data_uri(blk.data, blk.suffix)}">'
                f"<figcaption>{badge}<b>{e(blk.title)}</b>. {e(blk.caption)}</figcaption></figure>"
            )
        elif isinstance(blk, Bullets):
            out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in blk.items) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ----- Markdown -----------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(rep: Report, files_dir: str = "report_files") -> tuple[str, dict[str, bytes]]:
    """Markdown text and the image files it references (relative name -> bytes)."""
    out: list[str] = []
    files: dict[str, bytes] = {}
    for blk in rep.blocks:
        if isinstance(blk, Heading):
            tag = f" `[{blk.level}]`" if blk.level else ""
            out.append(f"{'#' * blk.depth} {blk.text}{tag}\n")
        elif isinstance(blk, Para):
            if blk.code:
                out.append(f"```\n{blk.text}\n```\n")
            else:
                out.append(f"{blk.text}\n")
        elif isinstance(blk, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in blk.headers) + " |")
            out.append("|" + "---|" * len(blk.headers))
            for row in blk.rows:
                out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
            out.append("")
        elif isinstance(blk, Image):
            name = f"{files_dir}/{blk.key}{blk.suffix}"
            files[name] = blk.data
            level = f" `[{blk.level}]`" if blk.level else ""
            out.append(f"![{blk.title}]({name})\n\n*{blk.title}*{level}. {blk.caption}\n")
        elif isinstance(blk, Bullets):
            out += [f"- {i}" for i in blk.items]
            out.append("")
    return "\n".join(out) + "\n", files
