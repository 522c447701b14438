"""A results folder's documents as the report's blocks, in the order a reader needs them:

1. the answers (``summary``): per project, question, baseline, candidates, failures and
   decision in one sentence each, with numbers, evidence level and links to the documents;
2. one figure per question (``figures``, ``figures_time``), each with its table where it has
   one (the prediction errors under the predicted-against-measured figure);
3. the evidence levels;
4. the asset table, last and folded: every document with its headline metric and a link to
   its JSON file, the failures with their messages, and the files that are no documents.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from parlab.contract import Document, Entry, Skipped, headline
from parlab.report import figures, figures_time
from parlab.report.blocks import (
    Badge,
    Block,
    Bullets,
    Fold,
    Heading,
    Image,
    Link,
    Para,
    Report,
    Strong,
    Table,
    doc_anchor,
)
from parlab.report.format import ERROR_CONVENTION, LEVEL_MEANING, fmt_metric
from parlab.report.summary import answers, refs
from parlab.report.summary_mech import BUILDERS

FIGURES: tuple[tuple[str, str, Callable[[Sequence[Document]], Image | None]], ...] = (
    ("PAR-COLLECTIVES", "Collectives", figures.busbw),
    ("PAR-TRAINING-STATE", "Training state", figures.training),
    ("PAR-MODEL-INTERNAL", "Model internal", figures.model_internal),
    ("", "Predicted against measured", figures.accuracy),
    ("PAR-DISTRIBUTED-INFERENCE", "Serving", figures_time.serving),
    ("PAR-MOE-EXPERT", "MoE", figures_time.moe),
    ("", "Scheduling and overlap", figures_time.overlap),
)
"""Each figure: the project whose documents it draws ("" = all), its heading, its function."""


def _status(doc: Document) -> str:
    if doc.failure is not None:
        rank = "" if doc.failure.rank is None else f", rank {doc.failure.rank}"
        return f"failed ({doc.failure.kind}{rank})"
    return doc.status


def _rel(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(path, out_dir)).as_posix()


def asset_table(entries: Sequence[Entry], root: Path, out_dir: Path) -> Table:
    """One row per document, its run id linking to its JSON file, its row id to link to."""
    up, cut = _rel(root, out_dir), len(str(root)) + 1
    rows = []
    for e in entries:
        d = e.doc
        h = headline(d)
        rows.append(
            (
                d.project,
                d.task,
                d.role,
                Badge(d.evidence_level),
                _status(d),
                f"{h[0]} = {fmt_metric(h[1])}" if h else "-",
                Link(d.run_id, f"{up}/{str(e.path)[cut:].replace(os.sep, '/')}"),
                d.created,
            )
        )
    return Table(
        headers=(
            "project",
            "task",
            "role",
            "evidence",
            "status",
            "headline",
            "run_id (JSON)",
            "created",
        ),
        rows=tuple(rows),
        row_ids=tuple(doc_anchor(e.doc.run_id) for e in entries),
    )


def failure_table(entries: Sequence[Entry]) -> Table | None:
    rows = []
    for e in entries:
        f = e.doc.failure
        if f is not None:
            rows.append(
                (
                    Link(e.doc.run_id, "#" + doc_anchor(e.doc.run_id)),
                    e.doc.project,
                    Badge(e.doc.evidence_level),
                    f.kind,
                    "-" if f.rank is None else str(f.rank),
                    f.message,
                )
            )
    if not rows:
        return None
    return Table(
        headers=("run_id", "project", "evidence", "kind", "rank", "message"), rows=tuple(rows)
    )


def _machine(docs: Sequence[Document]) -> Para | None:
    envs = [d for d in docs if d.project == "PAR-ENV"] or list(docs)
    d = envs[-1]
    hw, sw = d.environment.get("hardware") or {}, d.environment.get("software") or {}
    gpus = hw.get("gpus") or []
    if not gpus:
        return None
    names = " + ".join(sorted({str(g.get("name")) for g in gpus}))
    links = (hw.get("interconnect") or {}).get("matrix") or []
    link = next((c for row in links for c in row if c not in ("X", "")), None)
    soft = ", ".join(f"{k} {sw[k]}" for k in ("torch", "cuda", "nccl") if sw.get(k))
    return Para(
        parts=(
            Strong("Machine: "),
            f"{len(gpus)} x {names}"
            + (f" joined by {link}" if link else "")
            + (f"; {soft}" if soft else ""),
            *refs([d]),
            " ",
            Badge(d.evidence_level),
            ".",
        )
    )


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
    docs = [e.doc for e in entries]
    by_project: dict[str, list[Document]] = {}
    for d in docs:
        by_project.setdefault(d.project, []).append(d)
    b = rep.blocks
    b.append(Heading(depth=1, text=rep.title, anchor="top"))
    b.append(Heading(depth=2, text="What the documents answer", anchor="summary"))
    levels = Counter(d.evidence_level for d in docs)
    b.append(
        Para(
            parts=(
                f"{len(docs)} distributed-benchmark/v1 document(s) under {root}, read "
                f"{generated}; levels: "
                + ", ".join(f"{lvl} ({n})" for lvl, n in sorted(levels.items()))
                + f". Every sentence names its evidence level and links the documents "
                f"it rests on (their rows in the asset table); {ERROR_CONVENTION}.",
            )
        )
    )
    if (m := _machine(docs)) is not None:
        b.append(m)
    for a in answers(by_project, BUILDERS):
        b.append(Heading(depth=3, text=a.title, anchor=f"answer-{a.project.lower()}"))
        b.append(Bullets(items=tuple((Strong(f"{name}: "), *parts) for name, parts in a.lines)))
    b.append(Heading(depth=2, text="Figures", anchor="figures"))
    for project, name, draw in FIGURES:
        group = by_project.get(project, []) if project else docs
        fig = draw(group) if group else None
        if fig is not None:
            b.append(Heading(depth=3, text=name, anchor=f"figure-{fig.key}"))
            b.append(fig)
    b.append(Heading(depth=2, text="Evidence levels", anchor="evidence-levels"))
    b.append(
        Table(
            headers=("level", "meaning", "documents"),
            rows=tuple(
                (Badge(lvl), LEVEL_MEANING[lvl], str(levels.get(lvl, 0))) for lvl in LEVEL_MEANING
            ),
        )
    )
    b.append(Heading(depth=2, text="Asset table", anchor="assets"))
    folded: list[Block] = [asset_table(entries, root, out_dir)]
    if (ft := failure_table(entries)) is not None:
        folded += [Heading(depth=3, text="Failures", anchor="failures"), ft]
    if skipped:
        folded += [
            Heading(depth=3, text="Files that are no documents", anchor="skipped"),
            Bullets(items=tuple((f"{_rel(s.path, out_dir)}: {s.reason}",) for s in skipped)),
        ]
    b.append(
        Fold(
            summary=f"{len(entries)} documents (project, role, evidence level, status, "
            f"headline metric, a link to each JSON file)"
            + (f", {len(skipped)} skipped file(s)" if skipped else ""),
            blocks=tuple(folded),
            anchor="asset-table",
        )
    )
    rep.run_ids = [d.run_id for d in docs]
    return rep
