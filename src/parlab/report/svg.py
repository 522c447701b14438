"""A small SVG plotting kit for the report: canvas, scales, axes, bars, lines, bands, legends.

Why not matplotlib: drawing the report's figures through matplotlib's Agg backend cost
0.2-0.6 s each on a 2-core machine (plus 0.6 s to import it), more than the whole report's
3-second budget allows; these figures are a few hundred SVG elements written as text in
milliseconds, stay sharp at any zoom, and are small enough to embed. Layout is explicit:
margins are sized from the longest label (``text_width``), category rows get a fixed height,
and legends wrap into rows, so labels never overlap.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""Tableau 10, the colours people know from matplotlib."""

FONT = 11.0
"""Default text size (px)."""


def text_width(text: str, size: float = FONT) -> float:
    """A safe over-estimate of the width of ``text`` in a sans-serif font (px)."""
    return len(text) * size * 0.6


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


@dataclass
class Canvas:
    """An SVG drawing of ``width`` x ``height`` px."""

    width: float
    height: float
    parts: list[str] = field(default_factory=list)

    def text(
        self,
        x: float,
        y: float,
        s: str,
        *,
        size: float = FONT,
        anchor: str = "start",
        colour: str = "#111",
        bold: bool = False,
        rotate: bool = False,
    ) -> None:
        """Text with its baseline at ``y`` (``rotate``: vertical, reading upwards)."""
        extra = ' font-weight="bold"' if bold else ""
        if rotate:
            extra += f' transform="rotate(-90 {_f(x)} {_f(y)})"'
        self.parts.append(
            f'<text x="{_f(x)}" y="{_f(y)}" font-size="{_f(size)}" text-anchor="{anchor}" '
            f'fill="{colour}"{extra}>{html.escape(s)}</text>'
        )

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **kw: str) -> None:
        attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())
        self.parts.append(
            f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0))}" height="{_f(max(h, 0))}" '
            f'fill="{fill}"{attrs}/>'
        )

    def line(
        self,
        points: Sequence[tuple[float, float]],
        colour: str,
        *,
        width: float = 1.5,
        dash: str = "",
    ) -> None:
        pts = " ".join(f"{_f(x)},{_f(y)}" for x, y in points)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="{width}"{d}/>'
        )

    def polygon(self, points: Sequence[tuple[float, float]], fill: str, opacity: float) -> None:
        pts = " ".join(f"{_f(x)},{_f(y)}" for x, y in points)
        self.parts.append(f'<polygon points="{pts}" fill="{fill}" fill-opacity="{opacity}"/>')

    def marker(self, x: float, y: float, colour: str, shape: str = "o", r: float = 3.5) -> None:
        """A point: ``o`` circle, ``d`` diamond, ``^`` triangle, ``s`` square, ``x`` cross."""
        if shape == "o":
            self.parts.append(f'<circle cx="{_f(x)}" cy="{_f(y)}" r="{_f(r)}" fill="{colour}"/>')
        elif shape == "x":
            for dx in (r, -r):
                self.line([(x - dx, y - r), (x + dx, y + r)], colour, width=2)
        else:
            pts = {
                "d": [(x, y - r * 1.3), (x + r, y), (x, y + r * 1.3), (x - r, y)],
                "^": [(x, y - r * 1.2), (x + r * 1.1, y + r), (x - r * 1.1, y + r)],
                "s": [(x - r, y - r), (x + r, y - r), (x + r, y + r), (x - r, y + r)],
            }[shape]
            self.polygon(pts, colour, 1.0)

    def svg(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(self.width)}" '
            f'height="{_f(self.height)}" viewBox="0 0 {_f(self.width)} {_f(self.height)}" '
            'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
            f'<rect width="100%" height="100%" fill="#fff"/>{"".join(self.parts)}</svg>'
        )


@dataclass(frozen=True)
class Scale:
    """Maps a domain ``lo..hi`` (linear, or logarithmic in ``base``) onto pixels ``a..b``."""

    lo: float
    hi: float
    a: float
    b: float
    base: float | None = None

    def __call__(self, v: float) -> float:
        if self.base:
            lo, hi, v = (math.log(max(x, 1e-300), self.base) for x in (self.lo, self.hi, v))
        else:
            lo, hi = self.lo, self.hi
        span = (hi - lo) or 1.0
        return self.a + (v - lo) / span * (self.b - self.a)

    def ticks(self, most: int = 7) -> list[float]:
        """Round tick values inside the domain: powers of the base (with 2 and 5 between powers
        of 10 when fewer than three powers fit), or 1-2-2.5-5 steps."""
        if self.base:
            k0 = math.ceil(math.log(self.lo, self.base) - 1e-9)
            k1 = math.floor(math.log(self.hi, self.base) + 1e-9)
            step = max(1, math.ceil((k1 - k0 + 1) / most))
            out = [self.base**k for k in range(k0, k1 + 1, step)]
            if self.base == 10 and len(out) < 3:
                k = math.floor(math.log10(self.lo))
                out = [m * 10**e for e in range(k, k1 + 2) for m in (1, 2, 5)]
                out = [v for v in out if self.lo <= v <= self.hi]
            return out
        raw = (self.hi - self.lo) / max(1, most - 1)
        mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        start = math.ceil(self.lo / step - 1e-9) * step
        n = int((self.hi - start) / step + 1e-9) + 1
        return [start + i * step for i in range(max(n, 0))]


def nice_max(v: float) -> float:
    """A round upper bound a little above ``v`` (for a linear axis from 0)."""
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    return next(
        m * mag for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12) if m * mag >= v * 1.05
    )


def number(v: float) -> str:
    """A label: ``0.5``, ``20``, ``1.2k``, ``49.5k``, ``3.4M`` (three significant digits)."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.4g}" if a >= 1000 else f"{v:.3g}"


@dataclass
class Panel:
    """A plotting area at ``x, y`` (top-left) of ``w`` x ``h`` px on a canvas."""

    c: Canvas
    x: float
    y: float
    w: float
    h: float
    sx: Scale | None = None
    sy: Scale | None = None

    def scales(
        self,
        xlo: float,
        xhi: float,
        ylo: float,
        yhi: float,
        *,
        xlog: float | None = None,
        ylog: float | None = None,
    ) -> None:
        self.sx = Scale(xlo, xhi, self.x, self.x + self.w, xlog)
        self.sy = Scale(ylo, yhi, self.y + self.h, self.y, ylog)

    def frame(
        self,
        *,
        title: str = "",
        xlabel: str = "",
        ylabel: str = "",
        xfmt: Callable[[float], str] | None = number,
        yfmt: Callable[[float], str] | None = number,
    ) -> None:
        """Grid lines, tick labels, axis labels and the title."""
        c = self.c
        c.rect(self.x, self.y, self.w, self.h, "none", stroke="#999", stroke_width="1")
        if self.sx and xfmt:
            for t in self.sx.ticks():
                px = self.sx(t)
                c.line([(px, self.y), (px, self.y + self.h)], "#e5e7eb", width=1)
                c.text(px, self.y + self.h + 13, xfmt(t), size=9.5, anchor="middle")
        if self.sy and yfmt:
            for t in self.sy.ticks(6):
                py = self.sy(t)
                c.line([(self.x, py), (self.x + self.w, py)], "#e5e7eb", width=1)
                c.text(self.x - 4, py + 3.5, yfmt(t), size=9.5, anchor="end")
        lines = title.split("\n") if title else []
        for i, line in enumerate(lines):  # the first line bold, any second one under it
            y = self.y - 7 - 14 * (len(lines) - 1 - i)
            c.text(self.x, y, line, size=11.5 if i == 0 else 10, bold=i == 0)
        if xlabel:
            c.text(self.x + self.w / 2, self.y + self.h + 28, xlabel, size=10, anchor="middle")
        if ylabel:
            c.text(self.x - 44, self.y + self.h / 2, ylabel, size=10, anchor="middle", rotate=True)


def legend(
    c: Canvas, x: float, y: float, width: float, entries: Sequence[tuple[str, str, str]]
) -> float:
    """Entries ``(label, colour, kind)`` (kind: ``bar``, ``line``, ``band``, ``dash`` or a marker
    shape) in rows from ``x, y`` that wrap at ``width``; returns the height used."""
    cx, cy = x, y
    for label, colour, kind in entries:
        w = 22 + text_width(label, 10) + 14
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + 16
        if kind == "bar":
            c.rect(cx, cy - 8, 14, 10, colour)
        elif kind == "band":
            c.rect(cx, cy - 8, 14, 10, colour, fill_opacity="0.25")
        elif kind in ("line", "dash"):
            c.line(
                [(cx, cy - 3), (cx + 16, cy - 3)], colour, width=2, dash="5,3" * (kind == "dash")
            )
        else:
            c.marker(cx + 7, cy - 3, colour, kind)
        c.text(cx + 22, cy, label, size=10)
        cx += w
    return cy - y + 16
