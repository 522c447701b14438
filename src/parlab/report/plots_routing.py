"""Routing plots, as SVG: latency tails per serving policy (``tail_rows``) and the load of
every expert with the rank that owns it (``expert_load``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parlab.report.groups import Spread
from parlab.report.svg import PALETTE, Canvas, Panel, legend, nice_max, text_width

STATS = (("p50", "o"), ("p90", "d"), ("p99", "^"))
"""The percentiles drawn, with their marker."""


@dataclass(frozen=True, kw_only=True)
class TailRow:
    """One routing policy: per column (TTFT, TPOT), a spread per percentile of ``STATS``."""

    label: str
    values: tuple[tuple[Spread | None, ...], ...]


def tail_rows(
    title: str, rows: Sequence[TailRow], columns: Sequence[str], *, width: float = 960
) -> str:
    """Per policy row and latency column: p50, p90, p99 markers at the median of the repeats,
    a line from p50 to p99 (the tail), and the p99's smallest-to-largest repeat as a whisker."""
    row_h = 22.0
    left = min(280.0, max([text_width(r.label, 10) for r in rows] + [40]) + 16)
    gap = 28.0
    col_w = (width - left - 12 - gap * (len(columns) - 1)) / len(columns)
    top, h = 30.0, row_h * len(rows)
    c = Canvas(width, top + h + 70)
    c.text(6, 16, title, size=11.5, bold=True)
    for i, r in enumerate(rows):
        c.text(left - 6, top + row_h * (i + 0.5) + 3.5, r.label, size=10, anchor="end")
    for j, name in enumerate(columns):
        spreads = [s for r in rows for s in r.values[j] if s is not None]
        lo = min([s.lo for s in spreads if s.lo > 0] + [1.0]) / 1.3
        hi = max([s.hi for s in spreads] + [lo * 10]) * 1.3
        p = Panel(c, left + j * (col_w + gap), top, col_w, h)
        p.scales(lo, hi, 0, 1, xlog=10)
        p.frame(xlabel=f"{name} (ms, log scale)", yfmt=None)
        assert p.sx is not None
        for i, r in enumerate(rows):
            cy = top + row_h * (i + 0.5)
            pts = [s for s in r.values[j] if s is not None]
            if len(pts) >= 2:
                c.line([(p.sx(pts[0].median), cy), (p.sx(pts[-1].median), cy)], "#9ca3af", width=3)
            last = r.values[j][-1]
            if last is not None and last.n > 1:
                c.line([(p.sx(last.lo), cy + 6), (p.sx(last.hi), cy + 6)], "#111", width=1)
            for (_, shape), s, colour in zip(STATS, r.values[j], PALETTE, strict=False):
                if s is not None:
                    c.marker(p.sx(s.median), cy, colour, shape, 4.2)
    entries = [
        (f"{stat} (median of the repeats)", PALETTE[k], shape)
        for k, (stat, shape) in enumerate(STATS)
    ]
    entries.append(("p99's smallest to largest repeat", "#111", "line"))
    legend(c, left, top + h + 50, width - left, entries)
    return c.svg()


@dataclass(frozen=True, kw_only=True)
class LoadPanel:
    """One routing law: assignments routed and kept per expert, and which rank owns each."""

    title: str
    routed: tuple[int, ...]
    kept: tuple[int, ...] | None
    owner: tuple[int, ...]
    """The rank holding each expert."""
    capacity: float | None
    """Assignments one expert can keep (summed over source ranks); None without a limit."""
    note: str
    """The per-rank load and the slowest rank, in words."""


def expert_load(panels: Sequence[LoadPanel], *, width: float = 960) -> str:
    """One bar per expert, coloured by its rank; the kept part solid, the dropped part pale,
    the capacity dashed; the slowest rank named under each panel's title."""
    ph, left = 184.0, 60.0
    c = Canvas(width, ph * len(panels) + 40)
    ranks = sorted({r for p in panels for r in p.owner})
    for k, lp in enumerate(panels):
        y0 = k * ph + 48
        p = Panel(c, left, y0, width - left - 16, ph - 92)
        top = max([*lp.routed, lp.capacity or 0])
        p.scales(-0.5, len(lp.routed) - 0.5, 0, nice_max(top))
        p.frame(title=lp.title, ylabel="assignments", xfmt=None)
        c.text(left, y0 + p.h + 30, lp.note, size=9.5, colour="#374151")
        assert p.sx is not None and p.sy is not None
        bw = max(1.0, (p.sx(1) - p.sx(0)) * 0.8)
        for e, routed in enumerate(lp.routed):
            colour = PALETTE[ranks.index(lp.owner[e]) % len(PALETTE)] if lp.owner else PALETTE[0]
            x = p.sx(e) - bw / 2
            kept = lp.kept[e] if lp.kept else routed
            c.rect(x, p.sy(routed), bw, p.sy(kept) - p.sy(routed), colour, fill_opacity="0.3")
            c.rect(x, p.sy(kept), bw, p.sy(0) - p.sy(kept), colour)
        step = max(1, len(lp.routed) // 16)
        for e in range(0, len(lp.routed), step):
            c.text(p.sx(e), y0 + p.h + 12, str(e), size=8.5, anchor="middle")
        if lp.capacity:
            cy = p.sy(lp.capacity)
            c.line([(left, cy), (left + p.w, cy)], "#b91c1c", width=1.3, dash="5,3")
    entries = [
        (f"experts on rank {r}", PALETTE[i % len(PALETTE)], "bar") for i, r in enumerate(ranks)
    ]
    entries += [("dropped (over capacity)", "#6b7280", "band"), ("capacity", "#b91c1c", "dash")]
    legend(c, left, ph * len(panels) + 30, width - left, entries)
    return c.svg()
