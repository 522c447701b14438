"""T6 commands: ``plan`` (admit or reject layouts, predict), ``decide`` (choose among measured
runs), ``report`` (the results folder as HTML and Markdown)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import console, err_console, print_json, reproduce_command, results_dir
from parlab.errors import UsageError


@app.command("report")
def report_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder (default: ./parlab-results)."),
    out: Path | None = typer.Option(
        None, "--out", help="Output folder (default: <results>/report)."
    ),
) -> None:
    """The results folder as one self-contained HTML file (plots embedded) and a Markdown twin."""
    from parlab.report import build_report

    root = results_dir(folder)
    outcome = build_report(root, out)
    console.print(
        f"report of {outcome.documents} document(s), {outcome.figures} figure(s)"
        + (f", {outcome.skipped} file(s) skipped" if outcome.skipped else "")
    )
    console.print(f"HTML: {outcome.html}")
    console.print(f"Markdown: {outcome.markdown}")


@app.command("decide")
def decide_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder (default: ./parlab-results)."),
    project: str | None = typer.Option(
        None, help="The project to decide (default: every project with runs to compare)."
    ),
    run_id: list[str] | None = typer.Option(
        None, "--run-id", help="Decide among exactly these runs (repeat the option)."
    ),
    metric: str | None = typer.Option(
        None, help="Objective metric (default per project, e.g. tokens_per_s_per_gpu)."
    ),
    lower_is_better: bool | None = typer.Option(
        None, "--lower-is-better/--higher-is-better", help="Direction of --metric."
    ),
    memory_budget: str | None = typer.Option(
        None, help="Reject runs whose peak memory exceeds this (e.g. 80GB, 70GiB)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decision document(s) as JSON."),
) -> None:
    """Choose among a project's measured runs; write the decision document."""
    from parlab import contract
    from parlab.plan.decide import decide, eligible_projects
    from parlab.units import parse_size

    root = results_dir(folder)
    budget = float(parse_size(memory_budget)) if memory_budget else None
    if project is None and not run_id:
        entries, _ = contract.read_results(root)
        projects = eligible_projects(entries)
        if not projects:
            raise UsageError(f"no project under {root} has runs to decide on: run one first")
    else:
        projects = [project] if project else [None]  # type: ignore[list-item]
    docs = []
    for p in projects:
        outcome = decide(
            root,
            project=p,
            run_ids=run_id or None,
            metric=metric,
            lower_is_better=lower_is_better,
            memory_budget=budget,
            command=reproduce_command(),
        )
        docs.append(outcome.doc.to_json())
        if not as_json:
            print_decision(outcome)
    if as_json:
        print_json(docs if len(docs) > 1 else docs[0])


def print_decision(outcome) -> None:  # type: ignore[no-untyped-def]
    d = outcome.doc
    dec = d.decision
    assert dec is not None
    console.rule(escape(f"{d.project}: decision [{d.evidence_level}]"))
    console.print(f"chosen: {dec.chosen or 'none'}")
    console.print(dec.reason)
    if dec.rejected:
        t = Table(title="rejected", title_justify="left")
        t.add_column("run")
        t.add_column("kind")
        t.add_column("reason", overflow="fold")
        for r in dec.rejected:
            t.add_row(r["candidate"], r.get("kind", ""), r["reason"])
        console.print(t)
    errs = {k: m for k, m in d.metrics.items() if k.startswith("prediction_error.")}
    if errs:
        t = Table(title="prediction error (predicted - measured) / measured", title_justify="left")
        t.add_column("run")
        t.add_column("metric")
        t.add_column("error", justify="right")
        for k, m in errs.items():
            _, run, name = k.split(".", 2)
            t.add_row(run, name, "unknown" if m.value is None else f"{m.value:+.1f} %")
        console.print(t)
    for n in d.notes:
        console.print(f"- {n}")
    if outcome.path is not None:
        err_console.print(f"wrote {outcome.path} ({d.evidence_level}, decision)")


def _csv(text: str | None, cast: type = str) -> tuple:  # type: ignore[type-arg]
    if text is None:
        return ()
    try:
        return tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"cannot parse list {text!r}: write comma-separated values") from None


@app.command("plan")
def plan_cmd(
    model: str = typer.Option(..., help="Catalog model (parlab.models) or a config.json path."),
    gpus: str | None = typer.Option(None, help="The cluster, COUNTxGPU (e.g. 64xH100)."),
    gpus_per_node: int | None = typer.Option(None, help="GPUs per node (default: 8, or --env's)."),
    env: Path | None = typer.Option(
        None, help="An environment document (parlab env) as the cluster."
    ),
    calibration: Path | None = typer.Option(
        None, help="A collectives calibration (file or results folder) for intra-node links."
    ),
    inter_node_bw: float | None = typer.Option(
        None, help="Inter-node bandwidth per GPU, GB/s (default: assumed 50)."
    ),
    global_batch: int = typer.Option(..., help="Sequences per optimizer step."),
    seq: int = typer.Option(..., help="Tokens per sequence."),
    mfu: float = typer.Option(0.40, help="Assumed MFU when --measured is not given."),
    measured: Path | None = typer.Option(
        None, help="A GPU training document whose measured MFU replaces the assumed one."
    ),
    micro_batches: str = typer.Option("1,2,4,8", help="Micro-batch sizes to try."),
    strategies: str = typer.Option("ddp,zero1,zero2,zero3,fsdp", help="Strategies to try."),
    recompute: str = typer.Option("none,selective,full", help="Recompute modes to try."),
    schedules: str = typer.Option(
        "1f1b,gpipe,interleaved",
        help="Pipeline schedules to try (also zbv: torch's zero-bubble V).",
    ),
    dtype: str = typer.Option("bf16-mixed", help="Ledger dtype policy."),
    optimizer: str = typer.Option("adamw", help="Ledger optimizer."),
    overlap: float = typer.Option(1.0, help="Fraction of backward that hides non-blocking comm."),
    memory_reserve: float = typer.Option(0.0, help="Fraction of GPU memory kept free."),
    max_exposed_comm: float | None = typer.Option(
        None, help="Reject candidates whose exposed comm exceeds this fraction of the step."
    ),
    gemm_width_half: float = typer.Option(
        0.0,
        help="n0 of the GEMM-width efficiency n/(n+n0), n = hidden/tp (0: constant MFU; "
        "benchmarks/plan_accuracy.py fits about 700 on Megatron's A100 runs).",
    ),
    roofline: Path | None = typer.Option(
        None,
        help="A results folder: fit the roofline (GEMM, attention, memory-bound work, overlap "
        "contention) on its measured GPU training runs and time candidates with it instead of "
        "one MFU (parlab.plan.calibrate; its NCCL calibration sets the links unless "
        "--calibration does).",
    ),
    project: str | None = typer.Option(None, help="Project of the document (default: by top)."),
    top: int = typer.Option(10, help="Rows of the ranking table."),
    results: Path | None = typer.Option(None, "--results", help="Results folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Admit or reject every layout with a reason, predict step time, rank, Pareto front."""
    from parlab import contract
    from parlab.comm.calibration import load_calibration
    from parlab.hardware.env import snapshot
    from parlab.models import get_spec
    from parlab.plan.document import plan_document, write_plan
    from parlab.plan.estimate import assumed_throughput, measured_throughput
    from parlab.plan.planner import PlanRequest, plan

    if project is not None and project not in contract.PROJECTS:
        raise UsageError(f"unknown project {project!r}: use one of {', '.join(contract.PROJECTS)}")
    spec = get_spec(model)
    rests_on: list[str] = []
    env_doc = None
    if env is not None:
        env_doc = contract.read_document(env)
        rests_on.append(env_doc.run_id)
    cal = load_calibration(calibration) if calibration is not None else None
    roof = shapes = None
    if roofline is not None:
        from parlab.plan.calibrate import collectives_calibration, lab_roofline
        from parlab.plan.shapes import gemm_shape_calibration

        if cal is None:
            cal = collectives_calibration(roofline)
        roof, fitted_on = lab_roofline(roofline, calibration=cal)
        rests_on.extend(fitted_on)
        shapes = gemm_shape_calibration(roofline)
    if cal is not None:
        rests_on.append(cal.run_id)
    from parlab.plan.space import make_cluster

    cluster = make_cluster(
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        env_doc=env_doc if gpus is None else None,
        calibration=cal,
        inter_node_bw=inter_node_bw * 1e9 if inter_node_bw else None,
    )
    peak = cluster.gpu.peak("bf16")
    if measured is not None:
        mdoc = contract.read_document(measured)
        throughput = measured_throughput(mdoc, peak or 0.0)
        rests_on.append(mdoc.run_id)
    else:
        throughput = assumed_throughput(mfu, peak, cluster.gpu.name)
    req = PlanRequest(
        spec=spec,
        cluster=cluster,
        global_batch=global_batch,
        seq=seq,
        throughput=throughput,
        micro_batches=_csv(micro_batches, int),
        strategies=_csv(strategies),
        recompute=_csv(recompute),
        schedules=_csv(schedules),
        dtype=dtype,
        optimizer=optimizer,
        overlap=overlap,
        memory_reserve=memory_reserve,
        max_exposed_comm=max_exposed_comm,
        gemm_width_half=gemm_width_half,
        roofline=roof,
        shapes=shapes,
    )
    result = plan(req)
    if shapes is not None and result.top is not None:
        from parlab.plan.planner import shapes_note

        note = shapes_note(req, result.top.cand)
        if note:  # the lab measured the top choice's shapes: say what they changed
            result.notes.append(note)
            rests_on.extend(shapes.run_id.split(" + "))
    if roofline is not None and result.top is not None and result.top.estimate is not None:
        from parlab.plan.host import host_note, host_step_calibration
        from parlab.plan.paramwork import param_work_calibration

        steps = host_step_calibration(roofline)
        work = param_work_calibration(roofline)
        note = host_note(
            steps,
            spec.name,
            result.top.cand,
            seq,
            result.top.estimate.compute_s,
            work=work,
            params=spec.num_params(),
        )
        if note and steps is not None:
            result.notes.append(note)
            rests_on.extend(steps.run_ids)
            if work is not None and "param-work probe" in note:
                rests_on.extend(work.run_ids)
    doc = plan_document(
        result,
        command=reproduce_command(),
        environment=snapshot(probe_links=False),
        project=project,
        rests_on=rests_on,
    )
    path = write_plan(doc, result, results_dir(results))
    if as_json:
        print_json(
            {
                "document": str(path),
                "run_id": doc.run_id,
                "chosen": doc.decision.chosen if doc.decision else None,
                "ranked": [v.to_json() for v in result.ranked],
                "pareto": [v.cand.name for v in result.pareto],
                "rejected": [v.to_json() for v in result.rejected],
                "notes": doc.notes,
            }
        )
    else:
        print_plan(result, path, top)
    if not result.ranked:
        raise typer.Exit(1)  # a valid answer (nothing fits), written, but no plan to run


def print_plan(result, path: Path, top: int) -> None:  # type: ignore[no-untyped-def]
    def format_bytes(x: float) -> str:
        return f"{x / 1e9:.1f} GB"

    req = result.request
    c = req.cluster
    console.rule(
        f"plan \\[analytic]: {req.spec.name} on {c.count} x {c.gpu.name} "
        f"({c.gpus_per_node} per node), global batch {req.global_batch} x {req.seq} tokens"
    )
    t = Table(title=f"top {min(top, len(result.ranked))} of {len(result.ranked)} admitted")
    for col in (
        "#",
        "candidate",
        "step",
        "compute",
        "exposed comm",
        "bubble",
        "tokens/s/GPU",
        "MFU",
        "peak/GPU",
        "headroom",
    ):
        t.add_column(col, overflow="fold")
    front = {id(v) for v in result.pareto}
    for i, v in enumerate(result.ranked[:top], 1):
        e = v.estimate
        t.add_row(
            f"{i}{'*' if id(v) in front else ''}",
            v.cand.name,
            f"{e.step_s:.3f} s",
            f"{e.compute_s:.3f} s",
            f"{e.comm_exposed_s:.3f} s",
            f"{e.bubble_s:.3f} s",
            f"{v.tokens_per_s_per_gpu:,.0f}",
            f"{100 * v.mfu:.1f} %",
            format_bytes(v.peak_bytes),
            format_bytes(v.headroom_bytes),
        )
    console.print(t)
    console.print("* on the Pareto front of throughput against peak memory")
    best = result.top
    if best is not None:
        e = best.estimate
        console.print(f"[bold]Top choice: {best.cand.name}[/bold]")
        if req.roofline is None:
            console.print(
                f"  compute {e.compute_s:.3f} s = {req.tokens_per_step:,} tokens x "
                f"{result.flops_per_token / 1e9:.3g} GFLOP/token"
                + (f" (+ {best.cand.recompute} recompute)" if best.cand.recompute != "none" else "")
                + f" / {c.count} GPUs / {req.throughput.achieved / 1e12:.0f} TFLOP/s "
                f"({req.throughput.source})"
            )
        else:
            console.print(
                f"  compute {e.compute_s:.3f} s per GPU (roofline: GEMMs, attention, memory-bound "
                f"work, slowed by the {e.comm_hidden_s:.3f} s of communication hidden under it; see notes)"
            )
        console.print(
            f"  communication: {e.comm_blocking_s:.3f} s blocking + {e.comm_overlappable_s:.3f} s "
            f"overlappable -> {e.comm_exposed_s:.3f} s exposed; largest: "
            + "; ".join(f"{d} {s:.3f} s" for d, s in e.top_items)
        )
        console.print(
            f"  bubble {e.bubble_s:.3f} s (pp {best.cand.pp}, {best.cand.microbatches} "
            f"micro-batches, v {best.cand.vpp}); peak {format_bytes(best.peak_bytes)} of "
            f"{format_bytes(req.usable_memory)} usable"
        )
    else:
        console.print("[red]no candidate is admitted[/red]")
    console.print(f"rejected {len(result.rejected)}:")
    shown: dict[str, int] = {}
    for v in result.rejected:
        if shown.get(v.kind, 0) < 2:
            shown[v.kind] = shown.get(v.kind, 0) + 1
            console.print(escape(f"  [{v.kind}] {v.cand.name}: {v.reason}"))
    console.print(
        "  totals: " + ", ".join(f"{k} {n}" for k, n in sorted(result.rejected_by_kind().items()))
    )
    console.print(
        "Pareto front: "
        + "; ".join(
            f"{v.cand.name} ({v.tokens_per_s_per_gpu:,.0f} tok/s, {format_bytes(v.peak_bytes)})"
            for v in result.pareto[:6]
        )
    )
    for n in result.notes:
        console.print(f"- {n}")
    console.print(
        f"searched {len(result.ranked) + len(result.rejected)} candidates in "
        f"{result.elapsed_s:.2f} s; document: {path}"
    )
