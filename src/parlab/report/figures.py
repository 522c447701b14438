"""The report's figures: PNG bytes drawn with matplotlib (Agg), from contract documents alone.

Each figure holds documents of ONE evidence level (its title and caption name
it), so a CPU mechanism run is never drawn beside a GPU measurement as if they
were the same kind of number. Figures made here:

- ``tokens_per_s_per_gpu``, ``mfu``, ``step_time``: one bar per document;
- ``peak_memory``: per-rank bars where the document has them, with the GPU's
  capacity from the document's environment as a dashed line;
- busbw per size: every document whose ``workload.measurements`` holds
  ``{op, size, busbw}`` rows (``parlab collectives`` sweeps), one line per op;
- serving latency: TTFT and TPOT (mean / median / p99, ms) per document;
- predicted against measured: for each metric that documents both predict and
  measure, the two bars side by side with the relative error above them.

Documents without the metric are left out of that figure; unknown values are
not drawn (their tables say "unknown").
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from parlab.contract import Document
from parlab.report.format import LEVEL_COLOUR, doc_label, fmt_value, relative_error

_DPI = 90
_MAX_DOCS = 24
"""At most this many documents per bar figure (the newest); tables list them all."""


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One rendered figure."""

    key: str
    """File-safe identifier, unique within a report."""
    title: str
    """What it shows (the evidence level is part of it)."""
    level: str
    """The one evidence level of every document drawn."""
    caption: str
    """One or two sentences: what is drawn, from which documents, how measured."""
    png: bytes
    """The image."""


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    _plt().close(fig)
    return buf.getvalue()


def _scalar_bars(
    docs: Sequence[Document],
    metric: str,
    *,
    level: str,
    ylabel: str,
    scale: float = 1.0,
) -> bytes | None:
    rows = [(d, d.metric(metric)) for d in docs]
    rows = [(d, v) for d, v in rows if v is not None and math.isfinite(v)][-_MAX_DOCS:]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 0.5 + 0.35 * len(rows) + 1.0))
    labels = [doc_label(d) for d, _ in rows]
    values = [v * scale for _, v in rows]
    ax.barh(range(len(rows)), values, color=LEVEL_COLOUR.get(level, "#444"))
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, (d, v) in enumerate(rows):
        ax.text(v * scale, i, " " + fmt_value(v, d.metrics[metric].unit), va="center", fontsize=7)
    ax.set_xlabel(ylabel)
    ax.set_title(f"{metric}  [{level}]", fontsize=10)
    ax.margins(x=0.25)
    return _png(fig)


def _peak_memory(docs: Sequence[Document], *, level: str) -> bytes | None:
    rows = [d for d in docs if d.metric("peak_memory") is not None][-_MAX_DOCS:]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    x = 0.0
    ticks, labels = [], []
    capacity = None
    for d in rows:
        m = d.metrics["peak_memory"]
        vals = [v for v in (m.per_rank or [m.value]) if v is not None]
        width = 0.8 / max(1, len(vals))
        for i, v in enumerate(vals):
            ax.bar(x - 0.4 + width * (i + 0.5), v / 2**30, width * 0.9, color=LEVEL_COLOUR[level])
        ticks.append(x)
        labels.append(doc_label(d))
        gpus = ((d.environment or {}).get("hardware") or {}).get("gpus") or []
        if gpus and gpus[0].get("memory_bytes"):
            capacity = max(capacity or 0, gpus[0]["memory_bytes"])
        x += 1.0
    if capacity:
        ax.axhline(capacity / 2**30, ls="--", color="#b91c1c", lw=1)
        ax.text(x - 0.5, capacity / 2**30, "GPU memory", color="#b91c1c", fontsize=7, va="bottom")
    ax.set_xticks(ticks, labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("peak memory per rank (GiB)")
    ax.set_title(f"peak_memory (one bar per rank)  [{level}]", fontsize=10)
    return _png(fig)


def sweep_rows(doc: Document) -> list[dict]:
    """The ``{op, size, busbw}`` rows of a collectives sweep document (empty when none)."""
    rows = doc.workload.get("measurements")
    if not isinstance(rows, list):
        return []
    return [
        r
        for r in rows
        if isinstance(r, dict)
        and isinstance(r.get("size"), (int, float))
        and isinstance(r.get("busbw"), (int, float))
        and r.get("size", 0) > 0
    ]


def _busbw(docs: Sequence[Document], *, level: str) -> bytes | None:
    docs = [d for d in docs if sweep_rows(d)][-6:]
    if not docs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    for d in docs:
        by_op: dict[str, list[tuple[float, float]]] = {}
        for r in sweep_rows(d):
            by_op.setdefault(str(r.get("op", "?")), []).append((r["size"], r["busbw"]))
        for op, pts in by_op.items():
            pts.sort()
            ax.plot(
                [p[0] for p in pts],
                [p[1] / 1e9 for p in pts],
                marker=".",
                lw=1,
                label=f"{op} ({doc_label(d)})" if len(docs) > 1 else op,
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size S (bytes, nccl-tests convention)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"busbw per size  [{level}]", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    return _png(fig)


_LAT_STATS = ("mean", "median", "p99")


def _serving(docs: Sequence[Document], *, level: str) -> bytes | None:
    docs = [
        d
        for d in docs
        if any(d.metric(f"{s}_{k}_ms") is not None for s in _LAT_STATS for k in ("ttft", "tpot"))
    ][-8:]
    if not docs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for ax, kind in zip(axes, ("ttft", "tpot"), strict=True):
        width = 0.8 / len(_LAT_STATS)
        for j, stat in enumerate(_LAT_STATS):
            vals = [d.metric(f"{stat}_{kind}_ms") for d in docs]
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(docs))]
            ax.bar(
                [x for x, v in zip(xs, vals, strict=True) if v is not None],
                [v for v in vals if v is not None],
                width * 0.9,
                label=stat,
            )
        ax.set_xticks(range(len(docs)), [doc_label(d) for d in docs], rotation=20, ha="right")
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylabel(f"{kind.upper()} (ms)")
        ax.set_title(f"{kind.upper()}  [{level}]", fontsize=10)
        ax.legend(fontsize=7)
    return _png(fig)


def prediction_pairs(doc: Document) -> list[tuple[str, float | None, float | None, str, str]]:
    """``(metric, predicted, measured, unit, model)`` for each prediction the document carries."""
    out = []
    for name, p in doc.predictions.items():
        measured = doc.metric(name)
        unit = doc.metrics[name].unit if name in doc.metrics else p.unit
        out.append((name, p.value, measured, unit, p.model))
    return out


def _predicted_vs_measured(docs: Sequence[Document], metric: str, *, level: str) -> bytes | None:
    rows = []
    for d in docs:
        for name, pred, meas, unit, _model in prediction_pairs(d):
            if name == metric and pred is not None and meas is not None:
                rows.append((d, pred, meas, unit))
    rows = rows[-_MAX_DOCS:]
    if not rows:
        return None
    unit = rows[0][3]
    scale, shown = {"B": (2**-30, "GiB"), "B/s": (1e-9, "GB/s")}.get(unit, (1.0, unit))
    rows = [(d, p * scale, m * scale, shown) for d, p, m, _u in rows]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r[1] for r in rows], 0.38, color="#9ca3af", label="predicted")
    ax.bar(
        [x + 0.2 for x in xs],
        [r[2] for r in rows],
        0.38,
        color=LEVEL_COLOUR[level],
        label=f"measured [{level}]",
    )
    for x, (_d, pred, meas, _u) in zip(xs, rows, strict=True):
        err = relative_error(pred, meas)
        if err is not None:
            ax.text(x, max(pred, meas), f"{100 * err:+.1f}%", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [doc_label(r[0]) for r in rows], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(f"{metric} ({rows[0][3]})")
    ax.set_title(f"{metric}: predicted vs measured  [{level}]", fontsize=10)
    ax.legend(fontsize=7)
    ax.margins(y=0.15)
    return _png(fig)


PREDICTION_FIRST = (
    "step_time",
    "peak_memory",
    "tokens_per_s_per_gpu",
    "comm_bytes_per_step",
    "dispatch_time",
    "mean_ttft_ms",
    "mean_tpot_ms",
)
"""Predicted-vs-measured figures for these metrics come first."""
MAX_PREDICTION_FIGURES = 6
"""At most this many predicted-vs-measured figures per project and level (the table has all)."""

SCALAR_FIGURES: tuple[tuple[str, str, float], ...] = (
    ("tokens_per_s_per_gpu", "tokens/s per GPU", 1.0),
    ("mfu", "MFU (%)", 100.0),
    ("step_time", "step time (s)", 1.0),
)
"""Metric, axis label, scale: the one-bar-per-document figures."""


def project_figures(project: str, docs: Sequence[Document], key_prefix: str) -> list[Figure]:
    """Every figure for one project's documents, one evidence level per figure."""
    out: list[Figure] = []
    levels = sorted({d.evidence_level for d in docs})
    for level in levels:
        group = [d for d in docs if d.evidence_level == level and d.role != "decision"]
        if not group:
            continue

        def add(name: str, title: str, caption: str, png: bytes | None, level: str = level) -> None:
            if png:
                out.append(
                    Figure(
                        key=f"{key_prefix}-{level}-{name}".replace(".", "_"),
                        title=f"{project}: {title} [{level}]",
                        level=level,
                        caption=f"Evidence level: {level}. {caption}",
                        png=png,
                    )
                )

        for metric, label, scale in SCALAR_FIGURES:
            add(
                metric,
                metric,
                f"One bar per document that measured {metric}; bars are labelled by layout "
                "and the tail of the run id.",
                _scalar_bars(group, metric, level=level, ylabel=label, scale=scale),
            )
        add(
            "peak_memory",
            "peak memory per rank",
            "Peak device memory of each rank (torch's max allocated where measured on a GPU); "
            "the dashed line is the GPU's capacity from the document's environment.",
            _peak_memory(group, level=level),
        )
        add(
            "busbw",
            "busbw per message size",
            "Bus bandwidth per size from the documents' measurement rows "
            "(busbw = algbw x the nccl-tests factor of the op).",
            _busbw(group, level=level),
        )
        add(
            "serving",
            "TTFT and TPOT",
            "Time to first token and time per output token (mean, median, p99; ms) "
            "as the load generator measured them.",
            _serving(group, level=level),
        )
        predicted = sorted(
            {n for d in group for n in d.predictions if n in d.metrics},
            key=lambda n: (PREDICTION_FIRST.index(n) if n in PREDICTION_FIRST else 99, n),
        )
        for metric in predicted[:MAX_PREDICTION_FIGURES]:
            add(
                f"pred-{metric}",
                f"{metric} predicted vs measured",
                f"Grey: the analytic prediction the document recorded before the run; coloured: "
                f"the measurement. The label is the relative error (predicted - measured) / "
                f"measured of {metric}.",
                _predicted_vs_measured(group, metric, level=level),
            )
    return out
