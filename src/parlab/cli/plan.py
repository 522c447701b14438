"""T6 commands: ``plan`` (admit or reject layouts, predict), ``decide`` (choose among measured
runs), ``report`` (the results folder as HTML and Markdown)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

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
from parlab.ledger import OPTIMIZERS
from parlab.units import parse_size


@app.command("report")
def report_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder (default: ./parlab-results)."),
    out: Path | None = typer.Option(
        None, "--out", help="Output folder (default: <results>/report)."
    ),
) -> None:
    """The results folder as one self-contained HTML file (plots embedded) and a Markdown twin."""
    from parlab.report import build_report  # lazy: parlab.report

    root = results_dir(folder)
    outcome = build_report(root, out)
    console.print(
        f"report of {outcome.documents} document(s), {outcome.figures} figure(s)"
        + (f", {outcome.skipped} file(s) skipped" if outcome.skipped else "")
    )
    console.print(f"HTML: {outcome.html}")
    console.print(f"Markdown: {outcome.markdown}")


DECIDE_HELP = """Choose among a project's measured runs, like with like; write the decision document.

Runs of one workload (model, sequence, global batch, GPU model and count, evidence level) are
grouped by configuration (their knobs); each configuration's value is the median over its
repeats. Only configurations that differ in the compared knob are ranked; the others are named
with what differs.

Examples:

  parlab decide results

  parlab decide results --project PAR-TRAINING-STATE --compare compile

  parlab decide results --project PAR-TRAINING-STATE --across compile,recompute --details
"""


@app.command("decide", help=DECIDE_HELP)
def decide_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder (default: ./parlab-results)."),
    project: str | None = typer.Option(
        None, help="The project to decide (default: every project with runs to compare)."
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="The knob to rank by (default per project: strategy for training state, layout "
        "for model internals and MoE, policy for serving, via for collectives).",
    ),
    across: str | None = typer.Option(
        None, "--across", help="Knobs also allowed to differ between ranked runs (a comma list)."
    ),
    baseline: str | None = typer.Option(
        None, "--baseline", help="Decide the workload and configuration class of this run."
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
        None, help="Reject configurations whose peak memory exceeds this (e.g. 80GB, 70GiB)."
    ),
    details: bool = typer.Option(False, "--details", help="Print every configuration and run."),
    out: Path | None = typer.Option(
        None, "--out", help="Write the decision document(s) here (default: the results folder)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decision document(s) as JSON."),
) -> None:
    from parlab.plan.decide import decide  # lazy: parlab.plan.decide

    root = results_dir(folder)
    budget = float(parse_size(memory_budget)) if memory_budget else None
    extra = [a.strip() for a in (across or "").split(",") if a.strip()]
    if project is None and not run_id and not baseline:
        projects = _projects_to_decide(root, [k for k in (compare, *extra) if k])
    else:
        projects = [project] if project else [None]  # type: ignore[list-item]
    docs_out = []
    for p in projects:
        outcome = decide(
            root,
            project=p,
            run_ids=run_id or None,
            baseline=baseline,
            compare=compare,
            across=extra,
            metric=metric,
            lower_is_better=lower_is_better,
            memory_budget=budget,
            command=reproduce_command(),
            out_dir=out,
        )
        docs_out.append(outcome.doc.to_json())
        if not as_json:
            print_decision(outcome, details=details)
    if as_json:
        print_json(docs_out if len(docs_out) > 1 else docs_out[0])


def _projects_to_decide(root: Path, wanted: list[str]) -> list[str]:
    """Every project under ``root`` with runs to compare; with ``wanted`` knobs, those that
    record them (the others named as skipped)."""
    from parlab.plan.decide import (  # lazy: parlab.plan.decide
        eligible_projects,
        knob_choices,
        read_projects,
    )

    entries = read_projects(root)
    projects = eligible_projects(entries)
    if not projects:
        raise UsageError(f"no project under {root} has runs to decide on: run one first")
    if not wanted:
        return projects
    docs = {p: [e.doc for e in entries if e.doc.project == p] for p in projects}
    known = {p: set(knob_choices(p, docs[p])) for p in projects}
    keep = [p for p in projects if set(wanted) <= known[p]]
    if not keep:
        raise UsageError(
            f"no project records {', '.join(wanted)}: give --project and one of its "
            "knobs (an unknown one lists them)"
        )
    for p in projects:
        if p not in keep:
            err_console.print(f"{p}: skipped, it records no {', '.join(wanted)}")
    return keep


def print_decision(outcome, *, details: bool = False) -> None:  # type: ignore[no-untyped-def]
    """One screen per project (``details``: every configuration, run and prediction error)."""
    from parlab.plan.decision_text import decision_lines  # lazy: parlab.plan.decision_text

    d = outcome.doc
    console.rule(escape(f"{d.project}: decision [{d.evidence_level}]"))
    for line in decision_lines(d, details=details):
        console.print(escape(line), overflow="fold")
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
    from parlab.cli.planning import run_plan  # lazy: numpy

    _refuse_renamed(strategies=strategies, micro_batches=micro_batches, schedules=schedules)
    run_plan(locals())


def _refuse_renamed(
    *, strategies: str | None, micro_batches: str | None, schedules: str | None
) -> None:
    """``UsageError`` naming the new flag where an old plural one was given."""
    for old, name, new in (
        (strategies, "--strategies", "--strategy"),
        (micro_batches, "--micro-batches", "--micro-batch"),
        (schedules, "--schedules", "--schedule"),
    ):
        if old is not None:
            raise UsageError(f"{name} is now {new} (a comma list): write {new} {old}")
