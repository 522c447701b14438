"""The report's figures, one per question, each from contract documents alone and each panel
holding one evidence level: busbw against size (collectives), tokens/s per GPU and peak
memory by strategy (training, one section per model; model internals, one per job), and
predicted against measured with the +-10 % band. The routing and overlap figures are in
``figures_time``. Every figure comes with alt text that states its main number, and a caption
that says what is drawn, from which documents and at which evidence level."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from parlab.contract import Document
from parlab.report.blocks import Badge, Image, Table
from parlab.report.format import ERROR_CONVENTION, prediction_error
from parlab.report.groups import Config, Spread, configs, field, job_title, jobs, main_job
from parlab.report.plots import Column, Point, Row, Section, bar_rows, scatter_panels
from parlab.report.plots_comm import Series, SizePanel, size_panels
from parlab.report.summary import is_probe
from parlab.report.sweeps import curves, link_bw

MAX_ROWS = 12
"""Configurations drawn per section (those with the most runs); the asset table has all."""


def main_level(docs: Sequence[Document]) -> str | None:
    """The evidence level a figure draws: the one with the most documents, GPU levels first."""
    count = Counter(d.evidence_level for d in docs)
    if not count:
        return None
    return max(count, key=lambda lvl: (lvl not in ("cpu-mechanism", "analytic"), count[lvl]))


def _scaled(s: Spread, k: float) -> Spread:
    return Spread(s.median * k, s.lo * k, s.hi * k, s.n)


def busbw(docs: Sequence[Document]) -> Image | None:
    """Busbw per size for every op on the default path, and the small all_reduce's time on
    every path."""
    sweeps = [d for d in docs if d.workload.get("kind") == "collectives-sweep"]
    level = main_level(sweeps)
    sweeps = [d for d in sweeps if d.evidence_level == level]
    cs = curves(sweeps)
    if not cs:
        return None
    link = link_bw(sweeps)
    left = [
        c
        for c in cs
        if c.path.startswith("torch")
        and "CUDA graph" not in c.path
        and "bfloat16" not in c.path
        and len(c.busbw) > 1
    ]
    series_l = tuple(
        Series(
            label=c.op if c.path == "torch" else f"{c.op}, {c.path.removeprefix('torch + ')}",
            points=tuple((s, _scaled(v, 1e-9)) for s, v in c.busbw.items()),
            dash=c.path != "torch",
        )
        for c in sorted(left, key=lambda c: (c.path != "torch", c.op))
    )
    small = [c for c in cs if c.op == "all_reduce" and sum(s <= 2**20 for s in c.time) >= 4]
    series_r = tuple(
        Series(
            label=c.path,
            points=tuple((s, _scaled(v, 1e6)) for s, v in c.time.items() if s <= 2**20),
        )
        for c in small
    )
    panels = [
        SizePanel(
            title="bus bandwidth per op",
            ylabel="busbw (GB/s)",
            series=series_l,
            ref=link / 1e9 if link else None,
            ref_label="link peak per direction" if link else "",
        )
    ]
    if series_r:
        panels.append(
            SizePanel(
                title="small all_reduce: time per call, per path",
                ylabel="time (us)",
                series=series_r,
            )
        )
    best = max(
        (c for c in left if c.path == "torch"),
        key=lambda c: max(v.median for v in c.busbw.values()),
        default=None,
    )
    alt = f"Bus bandwidth against message size for {len(series_l)} collective(s)"
    if best is not None:
        peak = max(v.median for v in best.busbw.values())
        share = f", {100 * peak / link:.0f} % of the {link / 1e9:.0f} GB/s link" if link else ""
        alt += f"; {best.op} peaks at {peak / 1e9:.0f} GB/s{share}"
    return Image(
        key="busbw",
        alt=alt + ".",
        title="Collectives: busbw against message size",
        caption=f"Evidence level: {level}, {len(sweeps)} sweep document(s) of parlab "
        "collectives. Left: busbw = algbw x the nccl-tests factor (all_reduce 2(n-1)/n; "
        "all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1), size "
        "in bytes as nccl-tests counts it, through torch's c10d (dashed: the same with an NCCL "
        "variable that differs between the sweeps); the dashed red line is the link's peak per "
        "direction recorded by the sweep. Right: time per small all_reduce on every path "
        "measured (torch or NCCL called directly, with or without CUDA graphs). Lines are the "
        "median of the repeats, the shaded band their range.",
        svg=size_panels(panels),
        levels=(level,) if level else (),
    )


def _gpu_memory(docs: Sequence[Document]) -> float | None:
    for d in docs:
        gpus = ((d.environment or {}).get("hardware") or {}).get("gpus") or []
        if gpus and gpus[0].get("memory_bytes"):
            return float(gpus[0]["memory_bytes"])
    return None


def _row(c: Config, metrics: Sequence[str], *, muted: bool = False) -> Row:
    values: list[Spread | str | None] = []
    for m in metrics:
        s = c.spread(m)
        if s is None and c.failed and c.failed[-1].failure:
            values.append(f"failed: {c.failed[-1].failure.kind}")
        else:
            values.append(s)
    runs = len(c.docs)
    base = " (baseline)" if any(d.role == "baseline" for d in c.docs) else ""
    return Row(
        label=f"{c.label}{base}" + (f"  x{runs}" if runs > 1 else ""),
        values=tuple(values),
        muted=muted,
    )


def _rows(job: Sequence[Document], metrics: Sequence[str]) -> list[tuple[Config, Row]]:
    cfgs = sorted(configs(job), key=lambda c: -len(c.docs))[:MAX_ROWS]
    first = metrics[0]
    cfgs.sort(key=lambda c: -(c.spread(first).median if c.spread(first) else -1.0))
    return [(c, _row(c, metrics)) for c in cfgs]


def training(docs: Sequence[Document]) -> Image | None:
    """Tokens/s per GPU and peak memory by strategy, one section per model."""
    runs = [d for d in docs if d.role != "decision" and not is_probe(d)]
    level = main_level([d for d in runs if d.metric("tokens_per_s_per_gpu") is not None])
    runs = [d for d in runs if d.evidence_level == level]
    by_model: dict[str, list[Document]] = defaultdict(list)
    for d in runs:
        by_model[str(field(d, "workload.model"))].append(d)
    sections = []
    for group in sorted(by_model.values(), key=len, reverse=True):
        job = main_job(group, lambda d: d.metric("tokens_per_s_per_gpu") is not None)
        if job:
            rows = _rows(job, ("tokens_per_s_per_gpu", "peak_memory"))
            sections.append(
                Section(
                    title=f"{job_title(job[0])} ({len(job)} runs)",
                    rows=tuple(r for _, r in rows),
                    refs=(None, _gpu_memory(job)),
                )
            )
    if not sections:
        return None
    cols = (
        Column(title="tokens/s per GPU"),
        Column(
            title="peak memory per GPU (GiB)",
            scale=2**-30,
            colour="#6b7280",
            ref_label="the GPU's memory",
        ),
    )
    top = sections[0].rows[0]
    return Image(
        key="training",
        alt=f"Tokens per second per GPU and peak memory by strategy for {len(sections)} "
        f"model(s); the fastest configuration of the first is {top.label.strip()}.",
        title="Training state: tokens/s per GPU and peak memory by strategy, one section per model",
        caption=f"Evidence level: {level}. For each model, the job (sequence, global batch, "
        "GPUs) with the most configurations; a configuration is the strategy plus every knob "
        "that varies inside the job; bars are the median of its repeats (xN), whiskers their "
        f"range; at most {MAX_ROWS} configurations per model. Peak memory is the CUDA "
        "allocator's high-water mark; the dashed line is the GPU's memory from the documents' "
        "environment.",
        svg=bar_rows(sections, cols),
        levels=(level,) if level else (),
    )


def model_internal(docs: Sequence[Document]) -> Image | None:
    """Speed-up over one GPU and peak memory per GPU, one section per job (TP, PP, CP)."""
    runs = [d for d in docs if d.role != "decision" and not is_probe(d)]
    level = main_level(runs)
    runs = [d for d in runs if d.evidence_level == level]
    sections = []
    for job in jobs(runs).values():
        if not any(d.metric("speedup_vs_single") is not None for d in job):
            continue
        rows = []
        for c, r in _rows(job, ("speedup_vs_single", "peak_memory")):
            if all(d.layout.get("world_size") == 1 for d in c.docs):  # the reference: 1x
                r = Row(
                    label=f"{c.label} (one GPU)",
                    values=(Spread(1.0, 1.0, 1.0, 1), r.values[1]),
                    muted=True,
                )
            rows.append(r)
        world = max(int(d.layout.get("world_size") or 1) for d in job)
        sections.append(
            Section(
                title=f"{job_title(job[0])} ({len(job)} runs)",
                rows=tuple(rows),
                refs=(float(world), _gpu_memory(job)),
            )
        )
    cols = (
        Column(title="speed-up over one GPU (x)", ref_label="perfect scaling (x GPUs)"),
        Column(
            title="peak memory per GPU (GiB)",
            scale=2**-30,
            colour="#6b7280",
            ref_label="the GPU's memory",
        ),
    )
    return Image(
        key="model-internal",
        alt=f"Speed-up over one GPU and peak memory per GPU for the tensor, pipeline and "
        f"context parallel layouts of {len(sections)} job(s).",
        title="Model internal: speed-up over one GPU and memory per GPU, one section per job",
        caption=f"Evidence level: {level}. speedup_vs_single = the one-GPU run's step time over "
        "the split run's, same global batch; the one-GPU rows are the reference (1x). Bars are "
        "the median of the repeats (xN), whiskers their range.",
        svg=bar_rows(sections, cols),
        levels=(level,) if level else (),
    )


ACCURACY_FIRST = (
    "peak_memory",
    "step_time",
    "comm_bytes_per_step",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "dispatch_time",
    "state_bytes.optimizer",
    "pp_bubble",
)
"""Predicted-vs-measured panels in this order (then by count), at most six."""


def accuracy_points(
    docs: Sequence[Document],
) -> dict[tuple[str, str], list[tuple[Document, float, float]]]:
    """(metric, level) -> (document, predicted, measured) for every recorded prediction that
    the same document measured."""
    out: dict[tuple[str, str], list[tuple[Document, float, float]]] = defaultdict(list)
    for d in docs:
        for name, p in d.predictions.items():
            m = d.metric(name)
            if p.value is not None and m is not None and p.value > 0 and m > 0:
                out[(name, d.evidence_level)].append((d, float(p.value), float(m)))
    return out


_UNIT_SCALE = {"B": (2**-30, "GiB"), "s": (1e3, "ms"), "fraction": (100, "%")}


def accuracy(docs: Sequence[Document]) -> Image | None:
    """Measured against predicted, one panel per metric, with the +-10 % band."""
    pts = accuracy_points(docs)
    if not pts:
        return None
    order = sorted(
        pts,
        key=lambda k: (ACCURACY_FIRST.index(k[0]) if k[0] in ACCURACY_FIRST else 99, -len(pts[k])),
    )[:6]
    panels, said = [], []
    for name, level in order:
        rows = pts[(name, level)]
        unit = rows[0][0].metrics[name].unit
        k, shown = _UNIT_SCALE.get(unit, (1.0, unit))
        within = sum(abs(prediction_error(p, m) or 0) <= 0.10 for _, p, m in rows)
        points = [
            Point(predicted=p * k, measured=m * k, group=d.project.removeprefix("PAR-").lower())
            for d, p, m in rows
        ]
        panels.append(
            (f"{name} [{level}]\n{within} of {len(rows)} runs within 10 %", shown, points)
        )
        said.append(f"{name} {within} of {len(rows)} within 10 %")
    return Image(
        key="accuracy",
        alt="Measured against predicted, one panel per metric: " + "; ".join(said) + ".",
        title="Predicted against measured, with the +-10 % band",
        caption="Evidence levels: "
        + ", ".join(sorted({lvl for _, lvl in order}))
        + " for the measurements (one per panel, in its title), analytic for the predictions. "
        "Each point is one run: x the prediction its document recorded before the run (ledger, "
        "planner, simulator), y what it measured. Points in the green band are within 10 %; "
        f"{ERROR_CONVENTION}. Log axes; a zero on either side is left out.",
        svg=scatter_panels(panels, fmt=lambda unit: lambda v: f"{v:g}"),
        table=accuracy_table(pts),
        levels=tuple(sorted({lvl for _, lvl in order})),
    )


def accuracy_table(pts: dict[tuple[str, str], list[tuple[Document, float, float]]]) -> Table:
    """Per (metric, level): runs, how many within 10 %, the median and the largest error."""
    rows = []
    for (name, level), found in sorted(pts.items(), key=lambda kv: -len(kv[1])):
        errs = sorted(e for _, p, m in found if (e := prediction_error(p, m)) is not None)
        if errs:
            worst = max(errs, key=abs)
            within = sum(abs(e) <= 0.10 for e in errs)
            median = f"{100 * errs[len(errs) // 2]:+.1f} %"
            rows.append(
                (name, Badge(level), str(len(errs)), str(within), median, f"{100 * worst:+.1f} %")
            )
    return Table(
        headers=("metric", "measured at", "runs", "within 10 %", "median error", "largest error"),
        rows=tuple(rows),
    )
