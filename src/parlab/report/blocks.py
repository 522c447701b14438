"""The report as data: blocks (headings, paragraphs, tables, images, folds) made of inline
parts (text, links, evidence-level badges).

``render`` builds a ``Report`` of these; ``html`` and ``markdown`` render the same blocks, so
the two versions always say the same thing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    """A link: to an anchor on the page (``#doc-...``) or a file relative to the report."""

    text: str
    href: str


@dataclass(frozen=True)
class Badge:
    """An evidence level, shown as a coloured badge."""

    level: str


@dataclass(frozen=True)
class Strong:
    """Bold text (the name of a sentence: question, baseline, ...)."""

    text: str


Inline = str | Link | Badge | Strong
Parts = tuple[Inline, ...]


@dataclass(frozen=True, kw_only=True)
class Heading:
    """A section title."""

    depth: int
    """1 (report title) to 4."""
    text: str
    """The title."""
    anchor: str = ""
    """HTML id."""


@dataclass(frozen=True, kw_only=True)
class Para:
    """A paragraph."""

    parts: Parts
    """Its text, links and badges in order."""
    code: bool = False
    """Show as code (a command)."""


@dataclass(frozen=True, kw_only=True)
class Bullets:
    """A bulleted list; each item is a sequence of inline parts."""

    items: tuple[Parts, ...]
    """The items."""
    anchor: str = ""
    """HTML id of the list."""


@dataclass(frozen=True, kw_only=True)
class Table:
    """A table; a cell is text, a link or a badge."""

    headers: tuple[str, ...]
    """Column titles."""
    rows: tuple[tuple[Inline, ...], ...]
    """Cells."""
    row_ids: tuple[str, ...] = ()
    """HTML id of each row (empty: none), so a sentence can link to the row of its document."""


@dataclass(frozen=True, kw_only=True)
class Image:
    """A figure: an SVG drawn from documents, with its alt text and caption."""

    key: str
    """File-safe name (Markdown writes ``report_files/<key>.svg``)."""
    alt: str
    """What the figure shows, in one sentence, for a reader who cannot see it."""
    title: str
    """Its title, shown bold before the caption."""
    caption: str
    """What is drawn, from which documents, how measured; names the evidence level."""
    svg: str
    """The image."""
    levels: tuple[str, ...] = ()
    """The evidence levels drawn (each panel holds one)."""
    table: Table | None = None
    """The figure's numbers as a table, shown under it."""


@dataclass(frozen=True, kw_only=True)
class Fold:
    """Blocks folded away under a one-line summary (``<details>``)."""

    summary: str
    """The line shown while folded."""
    blocks: tuple[Block, ...]
    """What unfolds."""
    anchor: str = ""
    """HTML id."""


Block = Heading | Para | Bullets | Table | Image | Fold


@dataclass(kw_only=True)
class Report:
    """The blocks of a report and what went in."""

    title: str
    """The report title."""
    blocks: list[Block] = field(default_factory=list)
    """Everything, in order."""
    run_ids: list[str] = field(default_factory=list)
    """Every document included."""

    @property
    def figures(self) -> list[Image]:
        """The figures, in order (folded ones included)."""
        out: list[Image] = []

        def walk(blocks: list[Block] | tuple[Block, ...]) -> None:
            for b in blocks:
                if isinstance(b, Image):
                    out.append(b)
                elif isinstance(b, Fold):
                    walk(b.blocks)

        walk(self.blocks)
        return out


_UNSAFE = re.compile(r"[^a-z0-9._]")


def anchor(text: str) -> str:
    """A file- and id-safe form of ``text``."""
    return _UNSAFE.sub("-", text.lower()).strip("-")


def doc_anchor(run_id: str) -> str:
    """The id of a document's row in the asset table."""
    return "doc-" + anchor(run_id)
