"""The MoE report's blocks and figures, from the run's documents alone."""

from __future__ import annotations

from typing import Any

from parlab.comm.ops import busbw_factor
from parlab.contract import Document
from parlab.parallel import expert_comm
from parlab.projects.figure import figure, pyplot
from parlab.report.blocks import Block, Bullets, Heading, Image, Para, Table
from parlab.report.format import fmt_value

FIGURES = {
    "load_png": ("load", "Load per expert and per rank"),
    "a2a_png": ("a2a", "All-to-all time against payload"),
    "overflow_png": ("overflow", "Overflow against capacity factor"),
    "training_png": ("training", "Learned routing"),
}
"""Artifact name -> (file suffix after the run's tag, title)."""


def _m(doc: Document, name: str) -> tuple[float | None, str]:
    met = doc.metrics.get(name)
    return (None, "") if met is None else (met.value, met.unit)


def cell(doc: Document, name: str) -> str:
    """Metric ``name`` as the report prints it (``unknown`` where the run has none)."""
    return fmt_value(*_m(doc, name))


def _kinds(docs: list[Document]) -> tuple[list[Document], Document | None, Document | None]:
    """The routing workloads' documents, the capacity sweep's and the learned routing's."""
    loads = [d for d in docs if d.workload.get("kind") in ("uniform", "zipf")]
    sweep = next((d for d in docs if d.workload.get("kind") == "capacity-factor sweep"), None)
    train = next((d for d in docs if d.workload.get("kind") == "learned routing"), None)
    return loads, sweep, train


def _load_figure(loads: list[Document], n: int, key: str) -> Image:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(loads)
    for j, d in enumerate(loads):
        routed = d.workload["per_expert_routed"]
        off = (j - (len(loads) - 1) / 2) * width
        ax1.bar([e + off for e in range(len(routed))], routed, width, label=d.workload["name"])
        comp = d.metrics["expert_compute_time"].per_rank or []
        rows = d.metrics["rank_load_max_over_mean"].per_rank or []
        ax2.bar([r + off for r in range(len(rows))], rows, width, label=d.workload["name"])
        for r, (h, t) in enumerate(zip(rows, comp, strict=False)):
            ax2.annotate(fmt_value(t, "s"), (r + off, h), ha="center", va="bottom", fontsize=7)
    ax2.set_xticks(range(n))
    ax1.set(title="assignments routed per expert", xlabel="expert", ylabel="token assignments")
    ax2.set(
        title="rows computed per rank (label: expert compute time)", xlabel="rank", ylabel="rows"
    )
    ax1.legend()
    ax2.legend()
    return figure(
        fig,
        key=key,
        title=FIGURES["load_png"][1],
        level=loads[0].evidence_level,
        caption="token assignments per expert; rows and compute per rank",
    )


def _a2a_figure(loads: list[Document], n: int, key: str) -> Image:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curve = loads[0].workload.get("reference_a2a_curve") or []
    if curve:
        ax.loglog(
            [c["bytes"] for c in curve],
            [c["seconds"] for c in curve],
            "o-",
            color="gray",
            label="all_to_all_single, equal splits (this run)",
        )
    cal = loads[0].workload.get("calibration_a2a")
    if cal and cal.get("points") and n > 1:
        pts = cal["points"]
        ax.loglog(
            [p[0] for p in pts],
            [p[0] * busbw_factor("all_to_all", n) / p[1] for p in pts],
            "s--",
            color="black",
            markersize=4,
            label=f"parlab collectives {cal['run_id']}",
        )
    if cal and cal.get("fit_curve") and n > 1:
        fc = [c for c in cal["fit_curve"] if c[1]]
        ax.loglog(
            [c[0] for c in fc], [c[1] for c in fc], ":", color="black", label=f"{cal['fit_label']}"
        )
    for d in loads:
        for phase, marker in (("dispatch", "^"), ("combine", "v")):
            b, t = _m(d, f"{phase}_bytes")[0], _m(d, f"{phase}_time")[0]
            if b and t:
                ax.loglog([b], [t], marker, markersize=9, label=f"{phase} {d.workload['name']}")
        p = d.predictions.get("dispatch_time")
        if p is not None and p.value:
            ax.loglog(
                [_m(d, "dispatch_bytes")[0]],
                [p.value],
                "x",
                markersize=10,
                label=f"{p.model} at this payload, {d.workload['name']}",
            )
    ax.set(title="all-to-all time against payload", xlabel="bytes per rank", ylabel="seconds")
    ax.legend(fontsize=7)
    return figure(
        fig,
        key=key,
        title=FIGURES["a2a_png"][1],
        level=loads[0].evidence_level,
        caption="dispatch and combine beside the plain all-to-all and the calibration",
    )


def _overflow_figure(sweep: Document, key: str) -> Image:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = sweep.workload["sweep"]
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        ax.plot(
            [r["capacity_factor"] for r in mine],
            [100 * r["overflow_rate"] for r in mine],
            "o-",
            label=name,
        )
    ax.set(
        title=f"overflow against capacity factor ({sweep.workload['drop_policy']})",
        xlabel="capacity factor",
        ylabel="dropped assignments (%)",
    )
    ax.legend()
    return figure(
        fig,
        key=key,
        title=FIGURES["overflow_png"][1],
        level=sweep.evidence_level,
        caption="dropped assignments of each workload at each capacity factor",
    )


def _training_figure(train: Document, key: str) -> Image:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, steps in train.workload["per_step"].items():
        ax.plot([s["step"] for s in steps], [s["max_vio"] for s in steps], "o-", label=mode)
    ax.set(title="learned routing: expert-load MaxVio per step", xlabel="step", ylabel="MaxVio")
    ax.legend()
    return figure(
        fig,
        key=key,
        title=FIGURES["training_png"][1],
        level=train.evidence_level,
        caption="expert-load MaxVio per step, per balancing mode",
    )


def figures(docs: list[Document], stem: str) -> dict[str, Image]:
    """The run's figures by artifact name (their files: ``<stem>-<suffix>.svg``)."""
    loads, sweep, train = _kinds(docs)
    n = docs[0].layout["world_size"]
    key = {art: f"{stem}-{suffix}" for art, (suffix, _) in FIGURES.items()}
    out: dict[str, Image] = {}
    if loads:
        out["load_png"] = _load_figure(loads, n, key["load_png"])
        out["a2a_png"] = _a2a_figure(loads, n, key["a2a_png"])
    if sweep is not None:
        out["overflow_png"] = _overflow_figure(sweep, key["overflow_png"])
    if train is not None:
        out["training_png"] = _training_figure(train, key["training_png"])
    return out


def _verdict(d: Document) -> str:
    parts = []
    for key, what in (
        ("a2a_busbw_vs_reference", "plain a2a in this run"),
        ("a2a_busbw_vs_calibration", "parlab collectives"),
    ):
        v = _m(d, key)[0]
        if v is not None:
            verdict = "met" if v >= 85 else "not met"
            if d.evidence_level == "cpu-mechanism":
                verdict = "gloo CPU ranks: no speed claim"
            parts.append(f"{v:.0f}% of {what} ({verdict})")
    name = d.workload["name"]
    return f"{name}: " + (", ".join(parts) if parts else "no reference (one rank)")


def _intro(docs: list[Document], loads: list[Document]) -> list[Block]:
    first = docs[0]
    lay, n = first.layout, first.layout["world_size"]
    sw = first.environment.get("software", {})
    gpus = first.environment.get("hardware", {}).get("gpus", [])
    device = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "CPU"
    wl = loads[0].workload if loads else {}
    levels = ", ".join(sorted({d.evidence_level for d in docs}))
    return [
        Heading(
            depth=1,
            text=f"MoE expert parallelism: ep {n}, {lay['experts']} experts, top-{lay['top_k']}",
        ),
        Bullets(
            items=(
                (
                    f"evidence: {levels} on {device} ({lay['backend']}; torch {sw.get('torch')}, "
                    f"CUDA {sw.get('cuda') or '-'}, NCCL {sw.get('nccl') or '-'})",
                ),
                (
                    f"layer: hidden {wl.get('hidden')}, expert FFN {wl.get('ffn_hidden')}, "
                    f"{lay['gating']} gating, capacity factor {lay['capacity_factor']}, drop "
                    f"{lay['drop_policy']}, {wl.get('dtype')}, {wl.get('tokens_per_rank')} tokens per "
                    f"rank; experts per rank {lay['expert_placement']}, hot experts "
                    f"{wl.get('hot_experts')}; expert FFNs run as {wl.get('expert_impl')}",
                ),
                (f"command: {first.command}",),
                ("documents: " + ", ".join(d.run_id for d in docs),),
            )
        ),
    ]


def _workloads(loads: list[Document], n: int) -> list[Block]:
    rows = tuple(
        (
            d.workload["name"],
            cell(d, "overflow_rate"),
            cell(d, "expert_load_max_over_mean"),
            cell(d, "expert_load_max_vio"),
            cell(d, "rank_load_max_over_mean"),
            f"{cell(d, 'dispatch_bytes')} in {cell(d, 'dispatch_time')}",
            f"{cell(d, 'combine_bytes')} in {cell(d, 'combine_time')}",
            cell(d, "a2a_busbw"),
            f"{cell(d, 'a2a_busbw_vs_reference')} of {cell(d, 'reference_a2a_busbw')}",
            f"{cell(d, 'a2a_busbw_vs_calibration')} of {cell(d, 'calibration_a2a_busbw')}",
            cell(d, "expert_compute_time"),
            f"rank {int(d.metrics['slowest_rank'].value or 0)} (+{cell(d, 'slowest_rank_excess')} over mean)",
            cell(d, "layer_time"),
            cell(d, "naive_layer_time"),
        )
        for d in loads
    )
    head = ("workload", "overflow", "expert max/mean", "expert MaxVio", "rank max/mean",
        "dispatch", "combine", "a2a busbw", "vs plain a2a", "vs calibration",
        "expert compute (max)", "slowest rank", "layer", "naive layer")  # fmt: skip
    correct = "; ".join(
        f"{d.workload['name']}: expert-parallel vs unsharded layer {cell(d, 'unsharded_max_abs_diff')}, "
        f"naive vs expert-parallel {cell(d, 'naive_max_abs_diff')} (largest |y| {cell(d, 'output_max_abs')})"
        for d in loads
    )
    skew = tuple(
        (
            d.workload["name"],
            *(
                f"{int(r or 0)} / {fmt_value(t, 's')}"
                for r, t in zip(
                    d.metrics["rank_load_max_over_mean"].per_rank or [],
                    d.metrics["expert_compute_time"].per_rank or [],
                    strict=False,
                )
            ),
        )
        for d in loads
    )
    return [
        Heading(depth=2, text="Routing workloads"),
        Table(headers=head, rows=rows),
        Para(
            parts=(
                f"Correctness on these devices (outputs, largest absolute difference): {correct}.",
            )
        ),
        Para(
            parts=(
                "Target (issue 7): dispatch + combine busbw at least 85% of the all_to_all busbw "
                "at the same payload. " + "; ".join(_verdict(d) for d in loads) + ".",
            )
        ),
        Heading(depth=3, text="How skew moves the slowest rank"),
        Table(headers=("workload", *(f"rank {r} rows / compute" for r in range(n))), rows=skew),
    ]


def _plans(loads: list[Document]) -> list[Block]:
    """Each workload's dispatch plan as a grid, and what was predicted of its dispatch."""
    out: list[Block] = []
    for d in loads:
        name, preds = d.workload["name"], d.predictions
        plan = d.workload.get("dispatch_plan") or []
        if plan and all(p is not None for p in plan):
            out += [
                Heading(depth=3, text=f"Dispatch plan, {name} (tokens sent, source rank x expert)"),
                Para(parts=(expert_comm.format_plan(plan),), code=True),
            ]
        if "dispatch_bytes" in preds:
            p = preds["dispatch_bytes"]
            out.append(
                Para(
                    parts=(
                        f"Analytic ({p.model}) dispatch payload {fmt_value(p.value, 'B')} "
                        f"per rank; measured {cell(d, 'dispatch_bytes')} (mean; less where "
                        "capacity dropped).",
                    )
                )
            )
        if "dispatch_time_alpha_beta" in preds:
            p = preds["dispatch_time_alpha_beta"]
            out.append(
                Para(
                    parts=(
                        f"Alpha-beta fit ({p.model}) predicted dispatch "
                        f"{fmt_value(p.value, 's')} for {name}; measured "
                        f"{cell(d, 'dispatch_time')}.",
                    )
                )
            )
        if "dispatch_time" in preds:
            p = preds["dispatch_time"]
            out.append(
                Para(
                    parts=(
                        f"The measured all_to_all busbw of {p.model} at this payload "
                        f"implies dispatch {fmt_value(p.value, 's')} for {name}; measured "
                        f"{cell(d, 'dispatch_time')}.",
                    )
                )
            )
    return out


def _sweep(sweep: Document) -> list[Block]:
    rows = sweep.workload["sweep"]
    cfs = list(dict.fromkeys(r["capacity_factor"] for r in rows))
    table = tuple(
        (name, *(fmt_value(r["overflow_rate"], "fraction") for r in rows if r["workload"] == name))
        for name in dict.fromkeys(r["workload"] for r in rows)
    )
    policy = sweep.workload["drop_policy"]
    return [
        Heading(depth=2, text=f"Overflow against capacity factor (drop by {policy})"),
        Table(headers=("workload", *(f"cf {c:g}" for c in cfs)), rows=table),
    ]


def _training(train: Document) -> list[Block]:
    rows = tuple(
        (
            mode,
            cell(train, f"max_vio_first_{mode}"),
            cell(train, f"max_vio_last_{mode}"),
            cell(train, f"overflow_rate_last_{mode}"),
            cell(train, f"loss_last_{mode}"),
            cell(train, f"step_time_{mode}"),
        )
        for mode in train.workload["per_step"]
    )
    head = ("balancing", "MaxVio first step", "MaxVio last step", "overflow last step",
        "loss last step", "step time")  # fmt: skip
    return [
        Heading(depth=2, text="Learned routing (a few training steps)"),
        Para(parts=(f"Data: {train.workload['data']}.",)),
        Table(headers=head, rows=rows),
    ]


def blocks(docs: list[Document], images: dict[str, Any]) -> list[Block]:
    """The report, in reading order, with the run's figures (``figures``)."""
    loads, sweep, train = _kinds(docs)
    out = _intro(docs, loads)
    if loads:
        out += _workloads(loads, docs[0].layout["world_size"]) + _plans(loads)
    if sweep is not None:
        out += _sweep(sweep)
    if train is not None:
        out += _training(train)
    out += [Heading(depth=2, text="Figures"), *images.values()]
    notes = list(dict.fromkeys(nt for d in docs for nt in d.notes))
    return [*out, Heading(depth=2, text="Method"), Bullets(items=tuple((n,) for n in notes))]
