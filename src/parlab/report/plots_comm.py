"""Communication plots, as SVG: bus bandwidth and time per message size (``size_panels``,
nccl-tests' axes: the size in bytes as nccl-tests counts it, busbw in GB/s = 1e9 B/s), and
where each rank's step went (``step_timeline``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parlab.report.groups import Spread
from parlab.report.svg import PALETTE, Canvas, Panel, legend, nice_max, number, text_width


def size_label(v: float) -> str:
    """``8``, ``1K``, ``64M``, ``1G``: nccl-tests' size shorthand (binary)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if v >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"


@dataclass(frozen=True, kw_only=True)
class Series:
    """One configuration of one op: a value per size (median and range of the repeats)."""

    label: str
    points: tuple[tuple[float, Spread], ...]
    dash: bool = False


@dataclass(frozen=True, kw_only=True)
class SizePanel:
    """One panel of ``size_panels``."""

    title: str
    ylabel: str
    series: tuple[Series, ...]
    ref: float | None = None
    """A dashed horizontal reference (the link's peak)."""
    ref_label: str = ""


def size_panels(panels: Sequence[SizePanel], *, width: float = 960) -> str:
    """Side-by-side panels of value against size (log2), one line per series (the median of
    its repeats) with the repeats' range shaded; each panel's legend under it."""
    n = len(panels)
    pw, ph, pad_l = (width - 10) / n, 300.0, 62.0
    legends = []
    for p in panels:
        colour = {s.label: PALETTE[i % len(PALETTE)] for i, s in enumerate(p.series)}
        entries = [(s.label, colour[s.label], "dash" if s.dash else "line") for s in p.series]
        if p.ref_label and p.ref:
            entries.append((p.ref_label, "#b91c1c", "dash"))
        legends.append((colour, entries))
    probe = Canvas(pw, 1000)
    rows = max(legend(probe, 0, 0, pw - pad_l - 14, e) for _, e in legends)
    c = Canvas(width, ph + rows + 4)
    for k, (sp, (colour, entries)) in enumerate(zip(panels, legends, strict=True)):
        x0 = 5 + k * pw + pad_l
        panel = Panel(c, x0, 28, pw - pad_l - 14, ph - 74)
        sizes = [s for ser in sp.series for s, _ in ser.points]
        ymax = nice_max(max([v.hi for ser in sp.series for _, v in ser.points] + [sp.ref or 0]))
        panel.scales(min(sizes), max(sizes), 0, ymax, xlog=2)
        panel.frame(
            title=sp.title,
            xlabel="size (bytes, nccl-tests' convention)",
            ylabel=sp.ylabel,
            xfmt=size_label,
        )
        assert panel.sx is not None and panel.sy is not None
        for ser in sp.series:
            pts = sorted(ser.points)
            col = colour[ser.label]
            if any(v.n > 1 for _, v in pts):
                band = [(panel.sx(s), panel.sy(v.hi)) for s, v in pts]
                band += [(panel.sx(s), panel.sy(v.lo)) for s, v in reversed(pts)]
                c.polygon(band, col, 0.2)
            line = [(panel.sx(s), panel.sy(v.median)) for s, v in pts]
            c.line(line, col, width=1.6, dash="4,3" if ser.dash else "")
            for x, y in line:
                c.marker(x, y, col, "o", 2.2)
        if sp.ref:
            ry = panel.sy(sp.ref)
            c.line([(x0, ry), (x0 + panel.w, ry)], "#b91c1c", width=1.3, dash="6,3")
        legend(c, x0, ph - 2, panel.w, entries)
    return c.svg()


PHASES = (
    ("compute alone", "#60a5fa"),
    ("compute with comm hidden under it", "#1d4ed8"),
    ("exposed comm", "#dc2626"),
    ("idle", "#d1d5db"),
)
"""The parts of a step, in the order drawn."""


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """One rank of one run: seconds per phase of ``PHASES`` (means over the analysed steps)."""

    label: str
    parts: tuple[float, float, float, float]
    note: str = ""


def step_timeline(sections: Sequence[tuple[str, Sequence[StepRow]]], *, width: float = 960) -> str:
    """Per run and rank, the step as consecutive segments: compute alone, compute overlapped by
    communication, communication left exposed, idle (ms)."""
    row_h = 18.0
    labels = [r.label for _, rows in sections for r in rows] or [""]
    left = min(300.0, max(text_width(lbl, 10) for lbl in labels) + 16)
    notes = [r.note for _, rows in sections for r in rows] or [""]
    right = max(text_width(n, 9.5) for n in notes) + 12
    heights = [30 + row_h * len(rows) + 30 for _, rows in sections]
    c = Canvas(width, sum(heights) + 30)
    y = 4.0
    for (title, rows), h in zip(sections, heights, strict=True):
        top = y + 24
        plot_w = width - left - right - 8
        xmax = nice_max(max([sum(r.parts) for r in rows] + [1e-9]) * 1e3)
        p = Panel(c, left, top, plot_w, row_h * len(rows))
        p.scales(0, xmax, 0, 1)
        p.frame(title=title, xlabel="ms per step", yfmt=None, xfmt=number)
        assert p.sx is not None
        for i, r in enumerate(rows):
            cy = top + row_h * (i + 0.5)
            c.text(left - 6, cy + 3.5, r.label, size=10, anchor="end")
            x = 0.0
            for v, (_, colour) in zip(r.parts, PHASES, strict=True):
                c.rect(p.sx(x * 1e3), cy - 6, p.sx((x + v) * 1e3) - p.sx(x * 1e3), 12, colour)
                x += v
            c.text(left + plot_w + 6, cy + 3.5, r.note, size=9.5)
        y += h
    legend(c, left, y + 14, width - left, [(n, col, "bar") for n, col in PHASES])
    return c.svg()
