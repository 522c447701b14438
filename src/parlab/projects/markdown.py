"""A project's own report: ``parlab.report``'s blocks, written as Markdown beside its documents.

Each project's ``report.py`` returns blocks (headings, paragraphs, tables as rows, bullets,
figures as SVG with a caption) and never writes Markdown itself; the constructors here make
``parlab.report.blocks`` from plain text, and ``write_markdown`` renders them with
``parlab.report.markdown.to_markdown`` and writes every figure beside the Markdown file, under
the name its block gives.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from parlab.contract import atomic_write_text
from parlab.report import blocks
from parlab.report.blocks import Block, Image, Report
from parlab.report.markdown import to_markdown


def Heading(*, depth: int, text: str) -> blocks.Heading:
    """A section title."""
    return blocks.Heading(depth=depth, text=text)


def Para(*, text: str, code: bool = False) -> blocks.Para:
    """A paragraph of plain text (``code``: a command)."""
    return blocks.Para(parts=(text,), code=code)


def Table(*, headers: list[str], rows: list[list[str]]) -> blocks.Table:
    """A table of plain-text cells."""
    return blocks.Table(headers=tuple(headers), rows=tuple(tuple(r) for r in rows))


def Bullets(*, items: list[str]) -> blocks.Bullets:
    """A bulleted list of plain-text items."""
    return blocks.Bullets(items=tuple((i,) for i in items))


def figure(fig: Any, *, key: str, title: str, caption: str, level: str | None) -> Image:
    """A matplotlib figure as an ``Image`` block (SVG; the figure is closed)."""
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    pyplot().close(fig)
    return Image(
        key=key, alt=title, title=title, caption=caption, svg=buf.getvalue(),
        levels=(level,) if level else (),
    )  # fmt: skip


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the Agg backend (no display)."""
    import matplotlib  # heavy: loaded only when a report draws a figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_markdown(title: str, blocks: list[Block], path: Path) -> dict[str, Path]:
    """Write ``blocks`` as Markdown to ``path`` and each figure beside it; returns the figure
    paths by block key and the Markdown's as ``report``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text, files = to_markdown(Report(title=title, blocks=blocks), files_dir=".")
    out: dict[str, Path] = {}
    for name, data in files.items():
        target = path.parent / name
        target.write_bytes(data)
        out[Path(name).stem] = target
    atomic_write_text(path, text)
    out["report"] = path
    return out
