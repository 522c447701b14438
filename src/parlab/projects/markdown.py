"""A project's own report: ``parlab.report``'s blocks, written as Markdown beside its documents.

Each project's ``report.py`` returns blocks (headings, paragraphs, tables as rows, bullets,
figures as PNG bytes with a caption) and never writes Markdown itself; ``write_markdown``
renders them with ``parlab.report.render.to_markdown`` and writes every figure beside the
Markdown file, under the name its block gives.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from parlab.contract import atomic_write_text
from parlab.report.render import Block, Image, Report, to_markdown


def figure(fig: Any, *, key: str, title: str, caption: str, level: str | None) -> Image:
    """A matplotlib figure as an ``Image`` block (PNG at 110 dpi; the figure is closed)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return Image(key=key, title=title, caption=caption, data=buf.getvalue(), level=level)


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
