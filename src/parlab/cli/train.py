"""``parlab train`` (one run, one document) and ``parlab project training-state`` (the set + report)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from parlab.cli import app
from parlab.cli.analytic import RecomputeOption
from parlab.cli.common import (
    COUNT,
    COUNT0,
    POSITIVE,
    Choice,
    MicroBatch,
    NnodesOption,
    NodeRankOption,
    Nproc,
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
    size,
    write,
)
from parlab.cli.project import project_app
from parlab.contract import Document
from parlab.errors import UsageError
from parlab.runtime.launch import NUMA_BINDINGS, default_timeout_s, on_nodes
from parlab.units import format_bytes

STRATEGY_CHOICES = (
    "ddp", "ddp-bucket", "ddp-naive", "zero1", "zero1-naive", "zero2", "zero2-naive", "zero3",
    "zero3-naive", "fsdp", "fsdp-hybrid", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3",
)  # fmt: skip
"""``parlab.projects.training_state.STRATEGIES`` (that module imports torch: named here, checked
equal by the tests, so ``--help`` stays fast)."""


def _fmt(v: float, unit: str) -> str:
    return format_bytes(v) if unit == "B" else f"{v:.4g} {unit}"


def _print_run(doc: object, path: Path) -> None:
    assert isinstance(doc, Document)
    if doc.failure is not None:
        f = doc.failure
        rank = "" if f.rank is None else f", rank {f.rank}"
        say_error(f"{doc.layout['strategy']} failed ({f.kind}{rank}): {f.message}")
        p = doc.predictions.get("peak_memory")
        if p is not None and p.value is not None:
            say_error(f"ledger predicted a peak of {format_bytes(p.value)} per rank")
        say_error(f"document: {path}")
        return
    t = Table(
        title=f"{doc.layout['strategy']} on {doc.layout['world_size']} ranks ({doc.evidence_level})"
    )
    for c in ("metric", "measured", "predicted"):
        t.add_column(c)
    for name, m in doc.metrics.items():
        if name.startswith("comm_count"):
            continue
        p = doc.predictions.get(name)
        t.add_row(
            name,
            "unknown" if m.value is None else _fmt(m.value, m.unit),
            "" if p is None or p.value is None else _fmt(p.value, m.unit),
        )
    console.print(t)
    steps = doc.workload.get("step_times") or []
    if len(steps) > 1:  # the spread behind the median: one slow step, or a slow run?
        console.print(
            f"steps: {len(steps)} timed, {_fmt(min(steps), 's')} to {_fmt(max(steps), 's')} "
            f"(median {_fmt(doc.metric('step_time') or 0.0, 's')})"
        )
    _print_phases(doc.workload.get("phase_times") or {})
    say(f"document: {path}")


def _print_phases(phases: dict[str, dict[str, list[float]]]) -> None:
    """Rank 0's median timed step by phase: the host's time to issue each (waits included) and,
    on GPU, the device's time between the same points (idle included)."""
    host, dev = phases.get("host") or {}, phases.get("device") or {}
    if not host:
        return
    console.print("a step by phase (rank 0, median of the timed steps):")
    t = Table()
    t.add_column("phase")
    t.add_column("host", justify="right")
    if dev:
        t.add_column("device", justify="right")
    for name, ts in host.items():
        row = [name, f"{statistics.median(ts) * 1e3:.1f} ms"]
        if dev:
            row.append(f"{statistics.median(dev[name]) * 1e3:.1f} ms" if dev.get(name) else "")
        t.add_row(*row)
    console.print(t)
    console.print(
        "host: the phase's calls, from the first to the last one's return (waits for the device "
        "included)"
        + ("; device: between the same points in its queue (idle included)" if dev else "")
    )


TrainStrategy = Annotated[
    str,
    typer.Option(
        click_type=Choice(STRATEGY_CHOICES),
        help="torch's ddp, fsdp, fsdp-hybrid; parlab's zero1|2|3 (and *-naive, ddp-bucket); "
        "deepspeed-zero1|2|3 where DeepSpeed is installed.",
    ),
]
Model = Annotated[str, typer.Option(help="Model preset (tiny, small, 1.3b, 8b, ...).")]
TrainNproc = Annotated[
    int,
    typer.Option(
        click_type=COUNT, help="Ranks on this node: GPUs, or gloo CPU processes without GPUs."
    ),
]
Steps = Annotated[int, typer.Option(click_type=COUNT, help="Timed steps.")]
Warmup = Annotated[
    int,
    typer.Option(
        click_type=COUNT, help="Untimed steps first (one metered step follows the timed ones)."
    ),
]
GlobalBatch = Annotated[
    int | None,
    typer.Option(
        "--global-batch",
        click_type=COUNT,
        help="Sequences per step over all ranks (the world size must divide it).",
    ),
]
Seq = Annotated[int, typer.Option(click_type=COUNT, help="Tokens per sequence.")]
TrainDtype = Annotated[
    str,
    typer.Option(
        click_type=recipe_choice(("fp32", "bf16-compute", "bf16-params")),
        help="Precision recipe (docs/cli.md): fp32; bf16-compute (bf16 compute, fp32 states); "
        "bf16-params (zero1, zero2: bf16 params and grads, fp32 master shards; deepspeed-zero*: "
        "DeepSpeed's bf16).",
    ),
]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile each block.")]
Optimizer = Annotated[
    str, typer.Option(click_type=Choice(("adamw", "sgd")), help="adamw (fused on CUDA) or sgd.")
]
Lr = Annotated[float, typer.Option(click_type=POSITIVE, help="Learning rate.")]
Reshard = Annotated[
    bool, typer.Option("--reshard/--no-reshard", help="FSDP: free gathered params after forward.")
]
HybridShard = Annotated[
    int | None,
    typer.Option(
        "--hybrid-shard",
        click_type=COUNT,
        help="fsdp-hybrid: ranks per shard group (default nproc/2).",
    ),
]
MemoryCap = Annotated[
    str | None,
    typer.Option(
        "--memory-cap", help="Per-rank memory limit (e.g. 2MiB): past it the run is an OOM."
    ),
]
Data = Annotated[str | None, typer.Option(help="A local text file to train on (byte tokens).")]
Seed = Annotated[int, typer.Option(click_type=COUNT0, help="Seed of weights and data.")]
NumaBinding = Annotated[
    str | None,
    typer.Option(
        "--numa-binding",
        click_type=Choice(NUMA_BINDINGS),
        help="GPU runs: bind each rank to the CPUs near its GPU (torchrun's --numa-binding). "
        "CPU ranks are never bound.",
    ),
]
ManualGc = Annotated[
    int,
    typer.Option(
        "--manual-gc",
        click_type=COUNT0,
        help="N: Python's automatic garbage collection off while training, a young-generation "
        "collection every N steps instead (torchtitan's gc_freq, default 50); 0: automatic "
        "(its full collections pause the host mid-step).",
    ),
]
Roofline = Annotated[
    Path | None,
    typer.Option(
        "--roofline",
        help="A results folder: record the step time the lab predicts from it (parlab plan "
        "--roofline's model, as benchmarks/plan_accuracy.py applies it) in the document, made "
        "before the run starts.",
    ),
]


@app.command("train")
def train_cmd(
    strategy: TrainStrategy,
    model: Model = "tiny",
    nproc: TrainNproc = 2,
    steps: Steps = 5,
    warmup: Warmup = 2,
    micro_batch: MicroBatch = 2,
    global_batch: GlobalBatch = None,
    seq: Seq = 128,
    dtype: TrainDtype = "fp32",
    recompute: str = RecomputeOption,
    compile_: Compile = False,
    optimizer: Optimizer = "adamw",
    lr: Lr = 1e-3,
    reshard: Reshard = True,
    hybrid_shard: HybridShard = None,
    memory_cap: MemoryCap = None,
    data: Data = None,
    seed: Seed = 0,
    timeout: float | None = TimeoutOption,
    numa_binding: NumaBinding = None,
    manual_gc: ManualGc = 50,
    roofline: Roofline = None,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    results: Path | None = ResultsOption,
) -> None:
    """Train the reference model under one strategy; write one document with the ledger beside it."""
    from parlab.projects.training_state import TrainConfig, run_training  # lazy: torch

    check_roofline(roofline)
    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    world = nproc * job.nnodes
    root = results_dir(results)  # a bad folder is refused before anything runs
    with on_nodes(job):
        cfg = TrainConfig(
            strategy=strategy,
            model=model,
            nproc=world,
            steps=steps,
            warmup=warmup,
            micro_batch=micro_batch,
            global_batch=global_batch,
            seq=seq,
            dtype=dtype,
            recompute=recompute,
            compile=compile_,
            optimizer=optimizer,
            lr=lr,
            reshard_after_forward=reshard,
            hybrid_shard=hybrid_shard,
            memory_cap=size(memory_cap, "--memory-cap") if memory_cap else None,
            data=data,
            seed=seed,
            timeout_s=timeout or default_timeout_s(nproc),
            numa_binding=numa_binding,
            manual_gc=manual_gc,
        )
        doc = run_training(cfg, command=reproduce_command(), predict_from=roofline)
        path = write(doc, root)
    _print_run(doc, path)
    if doc.failure is not None:
        raise typer.Exit(1)


def check_roofline(roofline: Path | None) -> None:
    """``--roofline`` names a results folder (bad input before anything runs)."""
    if roofline is not None and not roofline.is_dir():
        raise UsageError(
            f"--roofline {roofline}: not a folder; give the results folder the GPU runs wrote"
        )


@project_app.command("training-state")
def training_state_cmd(
    results: Path | None = ResultsOption,
    model: str | None = typer.Option(None, help="Model (default: 1.3b on GPUs, tiny on CPU)."),
    nproc: Nproc = None,
    steps: int | None = typer.Option(None, click_type=COUNT, help="Timed steps per run."),
    seq: int | None = typer.Option(None, click_type=COUNT, help="Tokens per sequence."),
    only: list[str] | None = typer.Option(None, help="Only these strategies (repeat)."),
    report_only: bool = typer.Option(
        False, "--report-only", help="Only render the report from the documents already there."
    ),
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """The comparison set (DDP, ZeRO-1/2/3, FSDP) at CPU or GPU size, then the report."""
    from parlab.projects.training_state import run_project  # lazy: torch

    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    if job.multi and nproc is None:
        raise UsageError("on several nodes give --nproc (ranks on each node)")
    with on_nodes(job):
        paths = run_project(
            results_dir(results),
            model=model,
            nproc=None if nproc is None else nproc * job.nnodes,
            steps=steps,
            seq=seq,
            only=only,
            report_only=report_only,
            console=console,
        )
    for name, p in paths.items():
        say(f"{name}: {p}")
