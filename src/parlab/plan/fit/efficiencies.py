"""Fitting the roofline's efficiencies on measured runs: least squares on relative error.

Step time is linear in the inverse efficiencies (``parlab.plan.roofline.Work.parts``), so the
fit is one weighted linear least squares over the efficiencies left free; the GEMM width law's
n0 is searched over a grid. A client of ``parlab.plan.roofline``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from parlab.errors import UsageError
from parlab.plan.roofline import Roofline, Work


@dataclass(frozen=True, kw_only=True)
class FitRow:
    """One measured run as ``fit_roofline`` reads it."""

    work: Work
    """The run's work (``work`` with its layout and implementation)."""
    measured_s: float
    """Its measured step time."""
    other_s: float
    """Seconds the planner predicts outside compute: exposed communication and bubble."""
    hidden_s: float = 0.0
    """Communication the planner hides under its compute (what contention scales)."""


EFFICIENCIES = ("gemm", "attention", "ring_attention", "memory", "contention")
UNIT = Roofline(gemm=1.0, attention=1.0, ring_attention=1.0, memory=1.0)
"""Every efficiency 1: the fit's starting point, and the seconds per unit of inverse efficiency."""
WIDTH_HALVES = tuple(float(n) for n in range(0, 4001, 25))
"""The n0 values ``fit_roofline`` tries when it fits the GEMM width law."""


def _coefficients(
    row: FitRow, peak_flops: float, hbm_bw: float, base: Roofline
) -> dict[str, float]:
    unit = row.work.parts(UNIT, peak_flops, hbm_bw)
    ring = row.work.ring
    # the per-parameter work at its measured bandwidths (where ``base`` carries them) is a fixed
    # time; what still runs at the elementwise bandwidth scales with ``memory``
    fixed, unmeasured = row.work.step_split(base)
    return {
        "gemm": unit.gemm_s / base.width_factor(row.work.gemm_width),
        "attention": 0.0 if ring else unit.attention_s,
        "ring_attention": unit.attention_s if ring else 0.0,
        "memory": unit.elementwise_s + unmeasured / hbm_bw,
        "contention": row.hidden_s,
        "fixed": fixed,
    }


def _predicted(row: FitRow, roof: Roofline, peak_flops: float, hbm_bw: float) -> float:
    """The row's step time at ``roof`` (its other seconds held)."""
    parts = row.work.parts(roof, peak_flops, hbm_bw)
    return parts.total_s + row.other_s + roof.contention * row.hidden_s


def fit_roofline(
    rows: Sequence[FitRow],
    *,
    peak_flops: float,
    hbm_bw: float,
    fixed: Roofline | None = None,
    free: Sequence[str] = ("gemm", "attention", "memory"),
    source: str = "",
) -> Roofline:
    """Efficiencies fitted by least squares on relative error over measured runs.

    Step time is linear in the inverse efficiencies (and in the contention), so the fit is one
    weighted linear least squares over the ``free`` ones; the others keep ``fixed``'s values.
    ``gemm_width_half`` among ``free``: the width law's n0 is searched over ``WIDTH_HALVES``
    (the least squares above for each) and the best kept.
    A memory efficiency fitted above 1 (the byte counts already at or over what the kernels
    move) is held at 1, the catalog's bandwidth, and the rest refitted. ``UsageError`` when the
    runs cannot determine them (fewer runs than free terms, or an efficiency outside (0, 1]).
    """
    if "gemm_width_half" in free:
        return _fit_width_half(
            rows, peak_flops=peak_flops, hbm_bw=hbm_bw, fixed=fixed, free=free, source=source
        )
    bad = [k for k in free if k not in EFFICIENCIES]
    if bad:
        raise UsageError(f"cannot fit {', '.join(bad)}: fit some of {', '.join(EFFICIENCIES)}")
    if len(rows) < len(free):
        raise UsageError(f"{len(rows)} runs cannot fit {len(free)} efficiencies: give more runs")
    base = fixed or UNIT
    coefs = [_coefficients(r, peak_flops, hbm_bw, base) for r in rows]
    names = list(free)
    sol = _solve(rows, coefs, names, base)
    if "memory" in sol and 0.0 < sol["memory"] < 1.0:  # inverse efficiency below 1: over 100 %
        base = replace(base, memory=1.0)
        names.remove("memory")
        sol = _solve(rows, coefs, names, base)
    return replace(base, **_efficiencies(sol, base), source=source)


def _fit_width_half(
    rows: Sequence[FitRow],
    *,
    peak_flops: float,
    hbm_bw: float,
    fixed: Roofline | None,
    free: Sequence[str],
    source: str,
) -> Roofline:
    """``fit_roofline`` of the other ``free`` terms at each n0 of ``WIDTH_HALVES``: the fit of
    least squared relative error."""
    rest = tuple(k for k in free if k != "gemm_width_half")
    base = fixed or UNIT
    best: tuple[float, Roofline] | None = None
    for n0 in WIDTH_HALVES:
        try:
            r = fit_roofline(
                rows,
                peak_flops=peak_flops,
                hbm_bw=hbm_bw,
                fixed=replace(base, gemm_width_half=n0),
                free=rest,
                source=source,
            )
        except UsageError:
            continue
        err = sum(
            (_predicted(row, r, peak_flops, hbm_bw) / row.measured_s - 1.0) ** 2 for row in rows
        )
        if best is None or err < best[0]:
            best = (err, r)
    if best is None:
        raise UsageError("no GEMM width law fits these runs: give runs of several widths")
    return best[1]


def _solve(
    rows: Sequence[FitRow], coefs: list[dict[str, float]], names: Sequence[str], at: Roofline
) -> dict[str, float]:
    """The least squares on relative error for the inverse efficiencies (and contention)
    ``names``, every other term at ``at``'s value."""
    a, b = [], []
    for r, c in zip(rows, coefs, strict=True):
        known = sum(
            v if k == "fixed" else v * getattr(at, k) if k == "contention" else v / getattr(at, k)
            for k, v in c.items()
            if k not in names
        )
        a.append([c[k] / r.measured_s for k in names])
        b.append((r.measured_s - r.other_s - known) / r.measured_s)
    x, *_ = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)
    return dict(zip(names, (float(v) for v in x), strict=True))


def _efficiencies(sol: dict[str, float], base: Roofline) -> dict[str, float]:
    """``base``'s efficiencies with the solved ones in (an inverse efficiency inverted, the
    contention as it is); ``UsageError`` for one outside its range."""
    values = {k: getattr(base, k) for k in EFFICIENCIES}
    for k, v in sol.items():
        if k == "contention":
            if not 0.0 <= v <= 1.0:
                raise UsageError(
                    f"the runs fit a contention of {v:.3g}, outside [0, 1]: the hidden "
                    "communication does not explain their time"
                )
            values[k] = v
            continue
        if v < 1.0:
            raise UsageError(
                f"the runs fit a {k} efficiency of {1 / v if v > 0 else float('inf'):.3g}, "
                "outside (0, 1]: give runs where that work matters"
            )
        values[k] = 1.0 / v
    return values
