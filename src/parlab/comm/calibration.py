"""Fitting alpha and beta to a measured sweep, and the calibration document the planner loads.

Fit (per op): the sweep's slowest-rank mean time per size, ``t_i`` at size
``S_i``, is fitted by ``t = a + b S`` with weighted least squares minimising the
*relative* error ``sum(((a + b S_i) - t_i) / t_i)^2`` (plain least squares
would let the largest sizes decide everything and leave the latency
unfitted); ``a`` and ``b`` are kept non-negative. Then, with the ring
coefficients of ``parlab.comm.model``, ``alpha = a / k_alpha(n)`` and
``beta = b / k_beta(n)``. The fit error (root-mean-square and worst relative
error over the points) is reported with it: one straight line cannot follow
NCCL's protocol switches (LL, LL128, Simple) exactly, and the error says how
far it is off. Rows with wrong results are left out.

Calibration document: a ``distributed-benchmark/v1`` document, project
PAR-COLLECTIVES, task T1, role ``baseline``, with the evidence level of the
sweep it was fitted from (its parameters summarise those measurements) and
that sweep's environment. Its ``workload`` is::

    {"kind": "collectives-calibration",
     "calibration": {
        "format": "parlab-collectives-calibration/v1",
        "source_run_id": "...", "backend": "nccl", "dtype": "float",
        "group_size": 2, "devices": ["NVIDIA H200", ...],
        "link_bw": 478e9 | null, "link_bw_source": "...",
        "ops": {"all_reduce": {"algorithm": "ring", "group_size": 2,
                               "alpha_s": ..., "beta_s_per_byte": ...,
                               "intercept_s": ..., "slope_s_per_byte": ...,
                               "rms_rel_err": 0.03, "max_rel_err": 0.11,
                               "points": 31, "min_bytes": 8, "max_bytes": 8589934592,
                               "busbw_peak": ...}, ...}}}

and its metrics repeat the headline numbers per op (``<op>.alpha`` s,
``<op>.bandwidth`` B/s = 1/beta, ``<op>.fit_rms_rel_err`` %, ...).
``load_calibration(path_or_dir)`` reads one back (a file, or the newest in a
results folder) as a ``Calibration`` whose ``predict(op, nbytes, n)`` gives
seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parlab.comm import model
from parlab.contract import Document, Metric, new_run_id, now_iso, read_document, read_results
from parlab.errors import UsageError

FORMAT = "parlab-collectives-calibration/v1"
SWEEP_KIND = "collectives-sweep"
CALIBRATION_KIND = "collectives-calibration"


@dataclass(frozen=True, kw_only=True)
class OpFit:
    """The alpha-beta fit of one op."""

    op: str
    """The collective."""
    algorithm: str
    """The algorithm whose coefficients turned (a, b) into (alpha, beta): ``ring``."""
    group_size: int
    """n, the ranks it was measured over."""
    alpha_s: float
    """Latency per algorithm step, seconds."""
    beta_s_per_byte: float | None
    """Seconds per byte per direction; None for ops without payload (barrier)."""
    intercept_s: float
    """a: the fitted time at size 0, seconds."""
    slope_s_per_byte: float
    """b: the fitted seconds per byte of S."""
    rms_rel_err: float
    """Root-mean-square relative error of the fit over its points."""
    max_rel_err: float
    """Worst relative error over its points."""
    points: int
    """Sizes the fit used."""
    min_bytes: int
    """Smallest size fitted."""
    max_bytes: int
    """Largest size fitted."""
    busbw_peak: float
    """Highest measured busbw among the points, bytes/s."""

    def link(self) -> model.Link:
        beta = self.beta_s_per_byte if self.beta_s_per_byte else 1e-30
        return model.Link(alpha_s=self.alpha_s, beta_s_per_byte=beta, source="fit")

    def predict(self, nbytes: float, n: int | None = None) -> float:
        """Seconds for one op of ``nbytes`` over ``n`` ranks (default: as measured)."""
        n = self.group_size if n is None else n
        if n == self.group_size:
            return self.intercept_s + self.slope_s_per_byte * nbytes
        return model.collective_time(self.op, nbytes, n, self.link(), self.algorithm)


def fit_line(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` >= 0 minimising the relative error of ``a + b S`` against ``times``."""
    S = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if len(S) == 0 or np.any(t <= 0):
        raise ValueError("a fit needs at least one point and positive times")
    A = np.stack([1.0 / t, S / t], axis=1)
    y = np.ones_like(t)
    if len(S) >= 2 and np.ptp(S) > 0:
        (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    else:
        a, b = float(np.mean(t)), 0.0
    if a < 0:
        u = S / t
        a, b = 0.0, float(u.sum() / (u * u).sum())
    if b < 0:
        w = 1.0 / t
        a, b = float(w.sum() / (w * w).sum()), 0.0
    return float(a), float(b)


def fit_op(
    op: str,
    n: int,
    sizes: Sequence[int],
    times: Sequence[float],
    busbws: Sequence[float] | None = None,
    algorithm: str = "ring",
) -> OpFit:
    """Fit ``op`` measured over ``n`` ranks at ``sizes`` taking ``times`` seconds."""
    if op == "barrier" or all(s == 0 for s in sizes):
        a, b = float(np.mean(times)), 0.0
    else:
        a, b = fit_line(sizes, times)
    pred = np.asarray([a + b * s for s in sizes])
    rel = (pred - np.asarray(times)) / np.asarray(times)
    ka, kb = model.coefficients(op, n, algorithm)
    return OpFit(
        op=op,
        algorithm=algorithm,
        group_size=n,
        alpha_s=a / ka if ka else a,
        beta_s_per_byte=b / kb if kb and b > 0 else None,
        intercept_s=a,
        slope_s_per_byte=b,
        rms_rel_err=float(math.sqrt(float(np.mean(rel * rel)))),
        max_rel_err=float(np.max(np.abs(rel))),
        points=len(sizes),
        min_bytes=int(min(sizes)),
        max_bytes=int(max(sizes)),
        busbw_peak=float(max(busbws)) if busbws else 0.0,
    )


def fit_sweep(doc: Document) -> dict[str, OpFit]:
    """One fit per op measured in a sweep document (rows with wrong results left out)."""
    if doc.workload.get("kind") != SWEEP_KIND:
        raise UsageError(
            f"{doc.run_id} is not a collectives sweep (workload kind "
            f"{doc.workload.get('kind')!r}): fit a document written by 'parlab collectives'"
        )
    rows = doc.workload.get("measurements") or []
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("wrong") or not row.get("time_s"):
            continue
        by_op.setdefault(row["op"], []).append(row)
    if not by_op:
        raise UsageError(f"{doc.run_id} holds no correct measurements to fit: run a sweep first")
    fits = {}
    for op, rs in by_op.items():
        fits[op] = fit_op(
            op,
            int(rs[0]["group_size"]),
            [r["size"] for r in rs],
            [r["time_s"] for r in rs],
            [r["busbw"] for r in rs],
        )
    return fits


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A loaded calibration: per-op fits and where they come from."""

    run_id: str
    """The calibration document's run id."""
    source_run_id: str
    """The sweep it was fitted from."""
    evidence_level: str
    """The sweep's evidence level (``real-nccl``, ``cpu-mechanism``)."""
    backend: str
    """``nccl`` or ``gloo``."""
    group_size: int
    """n of the sweep."""
    devices: list[str]
    """The devices measured."""
    link_bw: float | None
    """The topology's per-direction peak, bytes/s (None: unknown)."""
    link_bw_source: str
    """Where ``link_bw`` comes from."""
    ops: dict[str, OpFit]
    """Op -> its fit."""

    @property
    def label(self) -> str:
        return f"alpha-beta:{self.run_id} ({self.evidence_level}, n={self.group_size})"

    def predict(self, op: str, nbytes: float, n: int | None = None) -> float | None:
        """Seconds for ``op`` of ``nbytes`` over ``n`` ranks, or None when ``op`` was not fitted."""
        fit = self.ops.get(op)
        return None if fit is None else fit.predict(nbytes, n)


def calibration_document(sweep: Document, *, command: str) -> Document:
    """Fit ``sweep`` and build its calibration document (not yet written)."""
    fits = fit_sweep(sweep)
    cal = sweep.workload.get("collectives", {})
    n = next(iter(fits.values())).group_size
    link_bw = sweep.workload.get("link_bw")
    link_src = sweep.workload.get("link_bw_source", "unknown")
    metrics: dict[str, Metric] = {}
    peak = max(f.busbw_peak for f in fits.values())
    metrics["busbw_peak"] = Metric(value=peak, unit="B/s")
    for op, f in fits.items():
        metrics[f"{op}.alpha"] = Metric(value=f.alpha_s, unit="s")
        if f.beta_s_per_byte:
            metrics[f"{op}.beta"] = Metric(value=f.beta_s_per_byte, unit="s/B")
            metrics[f"{op}.bandwidth"] = Metric(value=1.0 / f.beta_s_per_byte, unit="B/s")
            metrics[f"{op}.busbw_pct_of_link"] = Metric(
                value=100.0 * f.busbw_peak / link_bw if link_bw else None, unit="%"
            )
        metrics[f"{op}.fit_rms_rel_err"] = Metric(value=100.0 * f.rms_rel_err, unit="%")
        metrics[f"{op}.fit_max_rel_err"] = Metric(value=100.0 * f.max_rel_err, unit="%")
    body = {
        "format": FORMAT,
        "source_run_id": sweep.run_id,
        "backend": sweep.layout.get("backend"),
        "dtype": cal.get("dtype"),
        "group_size": n,
        "devices": sweep.workload.get("devices", []),
        "link_bw": link_bw,
        "link_bw_source": link_src,
        "ops": {op: asdict(f) for op, f in fits.items()},
    }
    notes = [
        f"fitted from {sweep.run_id} ({sweep.evidence_level}): t = a + b*S per op by "
        "least squares on relative error; alpha = a/k_alpha(n), beta = b/k_beta(n) "
        "with ring coefficients (parlab.comm.model)",
        "fit error is the relative error of the fitted line against each measured size",
    ]
    if not link_bw:
        notes.append(f"link peak unknown ({link_src}): percent of link not computed")
    return Document(
        run_id=new_run_id("collectives-calibration"),
        created=now_iso(),
        project="PAR-COLLECTIVES",
        task="T1",
        role="baseline",
        evidence_level=sweep.evidence_level,
        command=command,
        environment=sweep.environment,
        workload={"kind": CALIBRATION_KIND, "calibration": body},
        layout=dict(sweep.layout),
        metrics=metrics,
        notes=notes,
    )


def _from_document(doc: Document) -> Calibration:
    body = doc.workload["calibration"]
    if body.get("format") != FORMAT:
        raise UsageError(f"{doc.run_id}: calibration format {body.get('format')!r} is not {FORMAT}")
    return Calibration(
        run_id=doc.run_id,
        source_run_id=body["source_run_id"],
        evidence_level=doc.evidence_level,
        backend=body.get("backend") or "?",
        group_size=int(body["group_size"]),
        devices=list(body.get("devices") or []),
        link_bw=body.get("link_bw"),
        link_bw_source=body.get("link_bw_source") or "unknown",
        ops={op: OpFit(**f) for op, f in body["ops"].items()},
    )


def load_calibration(path_or_dir: str | Path) -> Calibration:
    """A calibration document (a file), or the newest one under a results folder."""
    path = Path(path_or_dir)
    if path.is_file():
        doc = read_document(path)
        if doc.workload.get("kind") != CALIBRATION_KIND:
            raise UsageError(
                f"{path} is not a collectives calibration: make one with "
                f"'parlab collectives --fit SWEEP.json'"
            )
        return _from_document(doc)
    if not path.exists():
        raise UsageError(f"calibration {path} does not exist: give a calibration file or folder")
    entries, _ = read_results(path)
    cals = [e for e in entries if e.doc.workload.get("kind") == CALIBRATION_KIND]
    if not cals:
        raise UsageError(
            f"no collectives calibration under {path}: run 'parlab collectives --fit SWEEP.json'"
        )
    return _from_document(cals[-1].doc)
