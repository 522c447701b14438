"""A project's matplotlib figure as a ``parlab.report.blocks.Image`` (SVG, with its caption and
evidence level), for the projects' ``report.py`` modules; ``pyplot`` loads matplotlib lazily."""

from __future__ import annotations

import io
from typing import Any

from parlab.report.blocks import Image


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
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    return plt
