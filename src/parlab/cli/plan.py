"""T6 commands: ``plan`` (admit or reject layouts, predict), ``decide`` (choose among measured
runs), ``report`` (the results folder as HTML and Markdown)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    Choice,
    Number,
    console,
    err_console,
    print_json,
    recipe_choice,
    reproduce_command,
    results_dir,
)
from parlab.errors import UsageError
from parlab.ledger.predict import OPTIMIZERS


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


PLAN_HELP = """Admit or reject every layout with a reason, predict step time, rank, Pareto front.

Examples:

  parlab plan --model llama3.1-405b --gpus 16384xH100 --global-batch 2048 --seq 8192

  parlab plan --model llama3.1-405b --gpus 16384xH100 --global-batch 2048 --seq 8192 \
    --layout pp=16,tp=8,dp=128 --tokens 15e12 --gpu-hour-price 2.5
"""


@app.command("plan", help=PLAN_HELP)
def plan_cmd(
    model: str = typer.Option(..., help="Catalog model (parlab.models) or a config.json path."),
    gpus: str | None = typer.Option(None, help="The cluster, COUNTxGPU (e.g. 64xH100)."),
    gpus_per_node: int | None = typer.Option(
        None, click_type=COUNT, help="GPUs per node (default: 8, or --env's)."
    ),
    env: Path | None = typer.Option(
        None, help="An environment document (parlab env) as the cluster."
    ),
    calibration: Path | None = typer.Option(
        None, help="A collectives calibration (file or results folder) for intra-node links."
    ),
    inter_node_bw: float | None = typer.Option(
        None, click_type=Number(), help="Inter-node GB/s per GPU (default: the catalog's NIC)."
    ),
    global_batch: int | None = typer.Option(
        None, click_type=COUNT, help="Sequences per optimizer step (default: 4 Mi tokens / --seq)."
    ),
    seq: int | None = typer.Option(
        None, click_type=COUNT, help="Tokens per sequence (default: 4096, or the model's longest)."
    ),
    mfu: float | None = typer.Option(
        None, click_type=Number(), help="Time every FLOP at this MFU instead of the built-in model."
    ),
    measured: Path | None = typer.Option(
        None, help="A GPU training document whose measured MFU times every FLOP."
    ),
    roofline: Path | None = typer.Option(
        None,
        help="A results folder: refit the compute model on its measured GPU runs "
        "(parlab.plan.fit) instead of the built-in one.",
    ),
    layout: str | None = typer.Option(
        None, help="Check one layout, e.g. pp=16,tp=8,dp=128 (axes pp, dp, cp, tp, ep)."
    ),
    micro_batch: str = typer.Option("1,2,4,8", help="Micro-batch sizes to try (sequences)."),
    strategy: str = typer.Option("ddp,zero1,zero2,zero3,fsdp", help="Strategies to try."),
    recompute: str = typer.Option("none,selective,full", help="Recompute modes to try."),
    schedule: str = typer.Option(
        "1f1b,interleaved", help="Pipeline schedules to try (also gpipe, zbv)."
    ),
    vpp: int | None = typer.Option(
        None, click_type=COUNT, help="Virtual stages per rank (with --layout)."
    ),
    tokens: float | None = typer.Option(
        None, click_type=Number(), help="Training budget in tokens (e.g. 15e12): time, GPU-hours."
    ),
    gpu_hour_price: float | None = typer.Option(
        None, click_type=Number(), help="Price of one GPU-hour (any currency), for --tokens."
    ),
    dtype: str = typer.Option(
        "bf16-params",
        click_type=recipe_choice(),
        help="Precision recipe (docs/cli.md; default: bf16 params and grads, fp32 master).",
    ),
    optimizer: str = typer.Option(
        "adamw-fused", click_type=Choice(OPTIMIZERS, flag="--optimizer"), help="Optimizer."
    ),
    overlap: float = typer.Option(
        1.0, click_type=Number(closed=True), help="Fraction of each window that hides comm."
    ),
    memory_reserve: float = typer.Option(
        0.0, click_type=Number(closed=True), help="Fraction of GPU memory kept free."
    ),
    max_exposed_comm: float | None = typer.Option(
        None, click_type=Number(), help="Reject candidates whose exposed comm exceeds this share."
    ),
    project: str | None = typer.Option(None, help="Project of the document (default: by top)."),
    top: int = typer.Option(10, click_type=COUNT, help="Rows of the ranking table."),
    results: Path | None = typer.Option(None, "--results", help="Results folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    strategies: str | None = typer.Option(None, hidden=True),
    micro_batches: str | None = typer.Option(None, hidden=True),
    schedules: str | None = typer.Option(None, hidden=True),
) -> None:
    from parlab.cli.planning import run_plan

    for old, new in (
        (strategies, "--strategy"),
        (micro_batches, "--micro-batch"),
        (schedules, "--schedule"),
    ):
        if old is not None:
            name = {"--strategy": "--strategies", "--micro-batch": "--micro-batches",
                    "--schedule": "--schedules"}[new]  # fmt: skip
            raise UsageError(f"{name} is now {new} (a comma list): write {new} {old}")
    run_plan(locals())
