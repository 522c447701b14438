"""Two plot shapes most of the report's figures are made of, drawn as SVG (``svg``):

- ``bar_rows``: sections (a model, a job) of rows (configurations), one column per metric;
  each bar is the median of a configuration's repeats with a whisker from its smallest to its
  largest value and the repeat count, so like configurations are one entry with a spread;
  a row with no value shows its note (``failed: oom``) instead; a column may carry a dashed
  reference line (the GPU's memory);
- ``scatter_panels``: predicted (x) against measured (y) on log axes, the diagonal and the
  +-10 % band shaded, one panel per metric, one colour per project.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parlab.report.groups import Spread
from parlab.report.svg import PALETTE, Canvas, Panel, Scale, legend, nice_max, number, text_width

ROW_H = 17.0
"""Height of one bar row (px)."""
REF_COLOURS = ("#16a34a", "#b91c1c")
"""Colours of the dashed reference lines of the first and second column."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One configuration: its label and, per column, a spread or a note."""

    label: str
    values: tuple[Spread | str | None, ...]
    muted: bool = False
    """Drawn grey: a reference row (the one-GPU run), not a candidate."""


@dataclass(frozen=True, kw_only=True)
class Section:
    """Rows drawn under one title (a model and its job)."""

    title: str
    rows: tuple[Row, ...]
    refs: tuple[float | None, ...] = ()
    """Per column, a reference value drawn as a dashed line (None: none)."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """A metric drawn in one column of bars."""

    title: str
    """Axis label, with its unit."""
    scale: float = 1.0
    """Multiply values by this for display (bytes to GiB: 2**-30)."""
    colour: str = PALETTE[0]
    ref_label: str = ""
    """What the reference line is."""


def _value_text(s: Spread) -> str:
    return number(s.median) + (f" ({s.n})" if s.n > 1 else "")


def bar_rows(sections: Sequence[Section], columns: Sequence[Column], *, width: float = 960) -> str:
    """Horizontal bars, one row per configuration, one column per metric (see module doc)."""
    labels = [r.label for s in sections for r in s.rows] or [""]
    left = min(300.0, max(text_width(lbl, 10) for lbl in labels) + 16)
    gap = 24.0
    col_w = (width - left - 10 - gap * (len(columns) - 1)) / len(columns)
    heights = [34 + ROW_H * len(s.rows) + 28 for s in sections]
    legend_h = 22.0
    c = Canvas(width, sum(heights) + legend_h + 6)
    y = 4.0
    for sec, h in zip(sections, heights, strict=True):
        c.text(6, y + 14, sec.title, size=11.5, bold=True)
        top, plot_h = y + 26, ROW_H * len(sec.rows)
        for i, row in enumerate(sec.rows):
            cy = top + ROW_H * (i + 0.5)
            c.text(left - 6, cy + 3.5, row.label, size=10, anchor="end")
        for j, col in enumerate(columns):
            _bar_column(c, sec, j, col, left + j * (col_w + gap), top, col_w, plot_h)
        y += h
    entries = [
        ("median of the repeats (count)", PALETTE[0], "bar"),
        ("smallest to largest repeat", "#111", "line"),
    ]
    entries += [
        (col.ref_label, REF_COLOURS[j % 2], "dash")
        for j, col in enumerate(columns)
        if col.ref_label
    ]
    legend(c, left, y + 12, width - left, entries)
    return c.svg()


def _bar_column(
    c: Canvas, sec: Section, j: int, col: Column, x: float, top: float, w: float, h: float
) -> None:
    spreads = [r.values[j] for r in sec.rows if isinstance(r.values[j], Spread)]
    ref = sec.refs[j] if j < len(sec.refs) else None
    hi = max([s.hi * col.scale for s in spreads if isinstance(s, Spread)] + [0.0])
    xmax = nice_max(max(hi * 1.3, (ref or 0) * col.scale * 1.02))
    p = Panel(c, x, top, w, h)
    p.scales(0, xmax, 0, 1)
    p.frame(xlabel=col.title, yfmt=None)
    assert p.sx is not None
    for i, row in enumerate(sec.rows):
        cy = top + ROW_H * (i + 0.5)
        v = row.values[j]
        if isinstance(v, Spread):
            colour = "#cbd5e1" if row.muted else col.colour
            c.rect(x, cy - 5.5, p.sx(v.median * col.scale) - x, 11, colour)
            if v.n > 1:
                lo, hi_ = p.sx(v.lo * col.scale), p.sx(v.hi * col.scale)
                c.line([(lo, cy), (hi_, cy)], "#111", width=1.2)
                c.line([(lo, cy - 3), (lo, cy + 3)], "#111", width=1.2)
                c.line([(hi_, cy - 3), (hi_, cy + 3)], "#111", width=1.2)
            end = p.sx(max(v.hi, v.median) * col.scale)
            c.text(
                end + 4, cy + 3.5, _value_text(Spread(v.median * col.scale, 0, 0, v.n)), size=9.5
            )
        elif isinstance(v, str):
            c.text(x + 4, cy + 3.5, v, size=9.5, colour="#b91c1c")
    if ref:
        rx = p.sx(ref * col.scale)
        c.line([(rx, top), (rx, top + h)], REF_COLOURS[j % 2], width=1.3, dash="5,3")


GROUP_COLOURS = {
    "training-state": PALETTE[0],
    "model-internal": PALETTE[1],
    "moe-expert": PALETTE[4],
    "distributed-inference": PALETTE[9],
    "collectives": PALETTE[5],
}
"""One colour per project in the predicted-against-measured figure."""


@dataclass(frozen=True, kw_only=True)
class Point:
    """One run's predicted and measured value of a metric."""

    predicted: float
    measured: float
    group: str
    """Its colour group (the project)."""


def scatter_panels(
    panels: Sequence[tuple[str, str, Sequence[Point]]],
    *,
    fmt: Callable[[str], Callable[[float], str]],
    width: float = 960,
) -> str:
    """``(title, unit, points)`` per panel: measured against predicted, log-log, with the
    diagonal and the +-10 % band; ``fmt(unit)`` formats tick labels."""
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    pw, ph, pad_l, pad_t = (width - 20) / cols, 262.0, 64.0, 42.0
    groups = sorted({pt.group for _, _, pts in panels for pt in pts})
    colour = {g: GROUP_COLOURS.get(g, PALETTE[i % len(PALETTE)]) for i, g in enumerate(groups)}
    c = Canvas(width, rows * ph + 30)
    for k, (title, unit, pts) in enumerate(panels):
        x0 = 10 + (k % cols) * pw + pad_l
        y0 = (k // cols) * ph + pad_t
        p = Panel(c, x0, y0, pw - pad_l - 16, ph - pad_t - 44)
        vals = [v for pt in pts for v in (pt.predicted, pt.measured) if v > 0]
        lo, hi = min(vals) / 1.25, max(vals) * 1.25
        if hi / lo < 10:  # at least one decade, centred, so the band is readable
            mid = math.sqrt(lo * hi)
            lo, hi = mid / math.sqrt(10), mid * math.sqrt(10)
        p.scales(lo, hi, lo, hi, xlog=10, ylog=10)
        f = fmt(unit)
        p.frame(
            title=title, xlabel=f"predicted ({unit})", ylabel=f"measured ({unit})", xfmt=f, yfmt=f
        )
        _band(c, p.sx, p.sy, lo, hi)
        assert p.sx is not None and p.sy is not None
        drawn = set()  # repeats that land on the same pixel are drawn once
        for pt in pts:
            if pt.predicted > 0 and pt.measured > 0:
                x, y = p.sx(pt.predicted), p.sy(pt.measured)
                if (key := (round(x), round(y), pt.group)) not in drawn:
                    drawn.add(key)
                    c.marker(x, y, colour[pt.group], "o", 2.8)
    entries = [("measured = predicted", "#111", "line"), ("within +-10 %", "#16a34a", "band")]
    entries += [(g, colour[g], "o") for g in groups]
    legend(c, 10 + pad_l, rows * ph + 14, width - pad_l - 20, entries)
    return c.svg()


def _band(c: Canvas, sx: Scale | None, sy: Scale | None, lo: float, hi: float) -> None:
    assert sx is not None and sy is not None
    xs = [lo * (hi / lo) ** (i / 20) for i in range(21)]
    upper = [(sx(x), sy(min(hi, 1.1 * x))) for x in xs]
    lower = [(sx(x), sy(max(lo, 0.9 * x))) for x in reversed(xs)]
    c.polygon(upper + lower, "#16a34a", 0.18)
    c.line([(sx(lo), sy(lo)), (sx(hi), sy(hi))], "#111", width=1)
