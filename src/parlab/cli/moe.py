"""``parlab project moe``: routing, capacity, overflow and all-to-all over expert-parallel ranks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from parlab.cli.common import (
    COUNT,
    COUNT0,
    NONNEGATIVE,
    POSITIVE,
    Backend,
    Choice,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    TimeoutOption,
    console,
    nodes,
    recipe_choice,
    reproduce_command,
    results_dir,
    say,
    say_error,
)
from parlab.cli.project import project_app
from parlab.errors import UsageError
from parlab.runtime.launch import default_timeout_s, on_nodes

if TYPE_CHECKING:  # the project imports torch: the command loads it lazily
    from parlab.projects.moe import MoEOutcome, MoERunConfig

MOE_DTYPES = {"auto": "auto", "fp32": "fp32", "bf16-all": "bf16"}
"""``--dtype`` -> the MoE runner's name (the whole layer, its optimizer states too, in it)."""


Ep = Annotated[
    int,
    typer.Option("--ep", click_type=COUNT, help="Expert-parallel degree: the ranks of the job."),
]
Experts = Annotated[
    int, typer.Option("--experts", click_type=COUNT, help="Routed experts E (a multiple of --ep).")
]
Topk = Annotated[
    int, typer.Option("--topk", click_type=COUNT, help="Experts per token k (at most E).")
]
CapacityFactor = Annotated[
    float,
    typer.Option(
        "--capacity-factor",
        click_type=POSITIVE,
        help="Capacity = ceil(k*T/E x factor) per expert per rank.",
    ),
]
Drop = Annotated[
    str,
    typer.Option(
        click_type=Choice(("position", "probability", "none")),
        help="Overflow policy (none: dropless).",
    ),
]
Gating = Annotated[
    str,
    typer.Option(click_type=Choice(("softmax", "sigmoid")), help="Gating (sigmoid: DeepSeek-V3)."),
]
Skew = Annotated[
    list[str] | None,
    typer.Option(
        "--skew", help="Skewed workload(s) zipf:S (repeat or comma-separate; default zipf:1.2)."
    ),
]
Hot = Annotated[
    str,
    typer.Option(
        click_type=Choice(("contiguous", "spread")),
        help="Where Zipf's hot experts sit: contiguous (all on rank 0) or spread (round-robin).",
    ),
]
Sweep = Annotated[
    str, typer.Option(help="Capacity factors of the overflow sweep (comma-separated).")
]
Hidden = Annotated[int, typer.Option(click_type=COUNT, help="Hidden size H.")]
FfnHidden = Annotated[
    int, typer.Option("--ffn-hidden", click_type=COUNT, help="Expert FFN size F.")
]
Tokens = Annotated[int, typer.Option(click_type=COUNT, help="Tokens per rank per forward.")]
TrainSteps = Annotated[
    int,
    typer.Option(
        "--train-steps",
        click_type=COUNT0,
        help="Learned-routing training steps per balancing mode (0: skip).",
    ),
]
Balance = Annotated[
    str, typer.Option(help="Balancing modes of the learned-routing workload: none, aux, bias.")
]
AuxCoeff = Annotated[
    float, typer.Option("--aux-coeff", click_type=NONNEGATIVE, help="Auxiliary-loss coefficient.")
]
BiasRate = Annotated[
    float,
    typer.Option("--bias-rate", click_type=NONNEGATIVE, help="Aux-loss-free bias update rate."),
]
MoeDtype = Annotated[
    str,
    typer.Option(
        click_type=recipe_choice(MOE_DTYPES),
        help="Precision recipe (docs/cli.md): fp32, bf16-all, or auto (bf16-all on GPUs, fp32 "
        "on CPU ranks).",
    ),
]
Warmup = Annotated[int, typer.Option(click_type=COUNT0, help="Untimed forwards per workload.")]
Iters = Annotated[
    int,
    typer.Option(click_type=COUNT, help="Timed forwards per workload (the median is reported)."),
]
Naive = Annotated[bool, typer.Option("--naive/--no-naive", help="Also time the all-gather path.")]
Seed = Annotated[
    int, typer.Option(click_type=COUNT0, help="Seed of weights, tokens and routing draws.")
]
Calibration = Annotated[
    Path | None,
    typer.Option(
        help="A `parlab collectives` document to compare with (default: the newest one in the "
        "results folder, if any).",
    ),
]
PlanOnly = Annotated[
    bool,
    typer.Option("--plan", help="Print each workload's dispatch plan and stop (nothing launched)."),
]


@project_app.command("moe")
def moe_cmd(
    ep: Ep = 2,
    experts: Experts = 8,
    topk: Topk = 2,
    capacity_factor: CapacityFactor = 1.25,
    drop: Drop = "position",
    gating: Gating = "softmax",
    skew: Skew = None,
    hot: Hot = "contiguous",
    sweep: Sweep = "0.5,0.75,1,1.25,1.5,2",
    hidden: Hidden = 256,
    ffn_hidden: FfnHidden = 512,
    tokens: Tokens = 2048,
    train_steps: TrainSteps = 8,
    balance: Balance = "none,aux,bias",
    aux_coeff: AuxCoeff = 0.01,
    bias_rate: BiasRate = 0.01,
    dtype: MoeDtype = "auto",
    warmup: Warmup = 2,
    iters: Iters = 5,
    naive: Naive = True,
    seed: Seed = 0,
    backend: Backend = "auto",
    timeout: float | None = TimeoutOption,
    calibration: Calibration = None,
    plan: PlanOnly = False,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    results: Path | None = ResultsOption,
) -> None:
    """PAR-MOE-EXPERT (T4): EP all-to-all vs naive, load per expert/rank, overflow, slowest rank."""
    from parlab.projects.moe import (  # lazy: torch
        MoERunConfig,
        parse_floats,
        parse_skews,
        run_moe_project,
    )

    skews = parse_skews(skew) if skew else (1.2,)
    cfg = MoERunConfig(
        ep=ep,
        experts=experts,
        topk=topk,
        capacity_factor=capacity_factor if drop != "none" else None,
        drop=drop,
        gating=gating,
        hidden=hidden,
        ffn_hidden=ffn_hidden,
        tokens=tokens,
        skews=skews,
        hot=hot,
        sweep=parse_floats(sweep, "--sweep"),
        train_steps=train_steps,
        balance=tuple(b.strip() for b in balance.split(",") if b.strip()),
        aux_coeff=aux_coeff,
        bias_rate=bias_rate,
        dtype=MOE_DTYPES[dtype],
        warmup=warmup,
        iters=iters,
        naive=naive,
        seed=seed,
        backend=backend,
        timeout_s=timeout or default_timeout_s(max(1, ep // nnodes), backend),
    )
    if plan:
        print_plans(cfg)
        return
    if calibration is not None and not calibration.is_file():
        raise UsageError(f"--calibration {calibration}: no such file; give a collectives document")
    root = results_dir(results)
    with on_nodes(nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)):
        outcome = run_moe_project(
            cfg, results=root, command=reproduce_command(), calibration=calibration
        )
    tell_outcome(outcome)


def print_plans(cfg: MoERunConfig) -> None:
    """Each workload's dispatch plan (tokens sent, source rank x expert); nothing launched."""
    from parlab.parallel.expert_comm import format_plan  # lazy: torch
    from parlab.projects.moe import dispatch_plans  # lazy: torch

    for name, grid in dispatch_plans(cfg).items():
        console.print(f"dispatch plan, {name} (tokens sent, source rank x expert):")
        console.print(format_plan(grid), markup=False)


def tell_outcome(outcome: MoEOutcome) -> None:
    """The files written, then the failure (exit 1) or the summary table and the report."""
    for p in outcome.paths:
        say_error(f"wrote {p}")
    if not outcome.ok:
        f = outcome.documents[0].failure
        say_error(f"moe run failed ({f.kind}, rank {f.rank}): {f.message}")
        raise typer.Exit(1)
    print_summary(outcome.documents)
    say(f"report: {outcome.report}")


def print_summary(docs: list) -> None:
    from parlab.projects.moe import cell as _cell  # lazy: torch

    table = Table(title="PAR-MOE-EXPERT", title_justify="left")
    cols = ("workload", "evidence", "overflow", "expert max/mean", "rank max/mean", "dispatch",
            "combine", "a2a busbw", "vs plain a2a", "slowest rank", "layer", "naive")  # fmt: skip
    for c in cols:
        table.add_column(c, overflow="fold")
    for d in docs:
        if d.workload.get("kind") not in ("uniform", "zipf"):
            continue
        table.add_row(
            d.workload["name"],
            d.evidence_level,
            _cell(d, "overflow_rate"),
            _cell(d, "expert_load_max_over_mean"),
            _cell(d, "rank_load_max_over_mean"),
            f"{_cell(d, 'dispatch_bytes')} / {_cell(d, 'dispatch_time')}",
            f"{_cell(d, 'combine_bytes')} / {_cell(d, 'combine_time')}",
            _cell(d, "a2a_busbw"),
            _cell(d, "a2a_busbw_vs_reference"),
            f"{int(d.metrics['slowest_rank'].value or 0)} (+{_cell(d, 'slowest_rank_excess')})",
            _cell(d, "layer_time"),
            _cell(d, "naive_layer_time"),
        )
    console.print(table)
