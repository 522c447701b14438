"""Analytic commands: ``parlab ledger`` (T2's per-rank ledger), ``parlab models``, and what they
share with ``parlab fit`` (``parlab.cli.fit``, T0).

Both compute from formulas only (``parlab.ledger``, ``parlab.models.flops``):
nothing is launched and nothing crosses a wire. Each writes one ``analytic``
document under PAR-TRAINING-STATE and prints a table (or the document with
``--json``). Bad input (unknown model or GPU, heads not divisible by TP,
layers not divisible by PP, zero or negative sizes) exits 2 before anything
is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from parlab import contract
from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    RANKS,
    Choice,
    JsonDocument,
    JsonPrint,
    MicroBatch,
    ResultsOption,
    console,
    print_json,
    recipe_choice,
    reproduce_command,
    results_dir,
    size,
    write,
)
from parlab.errors import UsageError
from parlab.hardware.catalog import GPUSpec, require
from parlab.hardware.env import snapshot
from parlab.ledger import OFFLOADS, OPTIMIZERS, STRATEGIES, Implementation, Ledger, predict
from parlab.ledger.activations import PP_SCHEDULES
from parlab.ledger.traffic import sync_points, traffic
from parlab.models import get_spec, list_specs
from parlab.topology import Topology
from parlab.units import MAX_WORLD, format_bytes, parse_cluster

PROJECT = "PAR-TRAINING-STATE"
RECOMPUTE = ("none", "selective", "full")

ModelArgument = typer.Argument(..., help="Catalog name (see parlab models) or a config.json path.")
OptimizerOption = typer.Option("adamw", "--optimizer", click_type=Choice(OPTIMIZERS))
RecomputeOption = typer.Option(
    "none", "--recompute", click_type=Choice(RECOMPUTE), help="Activation checkpointing."
)
DtypeOption = typer.Option(
    "bf16-compute",
    "--dtype",
    click_type=recipe_choice(),
    help="Precision recipe (docs/cli.md): fp32; bf16-compute (fp32 states); bf16-params "
    "(bf16 params and grads, fp32 master); bf16-all.",
)


def analytic_environment() -> dict[str, Any]:
    return snapshot(probe_links=False, light=True)  # light: no torch import, start-up < 1 s


def gpu_type(text: str, *, world: int | None = None) -> tuple[int | None, GPUSpec]:
    """``--gpus [COUNTx]GPU`` where the count may be left out; a count must equal ``world``."""
    count, name = parse_cluster(text, "--gpus", count=False)
    if world is not None and count is not None and count != world:
        raise UsageError(
            f"--gpus {text}: the layout has {world} ranks; give --gpus {world}x{name} or --gpus {name}"
        )
    return count, require(name)


def ledger_table(led: Ledger, title: str) -> Table:
    """The ledger's items as a table, one column per pipeline stage when pp > 1."""
    t = Table(title=title, title_justify="left")
    t.add_column("item")
    stages = len(led.peak_per_stage)
    for s in range(stages):
        t.add_column("bytes / rank" if stages == 1 else f"stage {s}", justify="right")
    t.add_column("kind")
    t.add_column("how")
    for it in led.items:
        where = it.kind + ("" if it.on_device else " (host)")
        t.add_row(it.name, *(format_bytes(v) for v in it.per_stage), where, it.formula)
    t.add_row(
        "[b]peak[/b]",
        *(f"[b]{format_bytes(v)}[/b]" for v in led.peak_per_stage),
        "",
        " / ".join(sorted(set(led.peak_phase))),
    )
    return t


def _state_per_rank(led: Ledger) -> list[int]:
    cols = [led.per_rank(n) for n in ("params", "grads", "optimizer", "master_params")]
    return [sum(x) for x in zip(*cols, strict=True)]


@app.command("ledger")
def ledger_cmd(
    model: str = ModelArgument,
    strategy: str = typer.Option("ddp", "--strategy", click_type=Choice(STRATEGIES)),
    dp: int = typer.Option(1, "--dp", click_type=RANKS, help="Data-parallel degree."),
    tp: int = typer.Option(1, "--tp", click_type=RANKS, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", click_type=RANKS, help="Pipeline-parallel degree."),
    cp: int = typer.Option(1, "--cp", click_type=RANKS, help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", click_type=RANKS, help="Expert-parallel degree (splits dp)."),
    shard_size: int | None = typer.Option(
        None, "--shard-size", click_type=COUNT, help="fsdp-hybrid: ranks per shard group."
    ),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism with TP."),
    seq: int | None = typer.Option(
        None, "--seq", click_type=COUNT, help="Sequence length (default: min(max_seq, 4096))."
    ),
    micro_batch: MicroBatch = 1,
    micro_batches: int = typer.Option(
        1, "--micro-batches", click_type=COUNT, help="Micro-batches per step (PP, or accumulation)."
    ),
    pp_schedule: str = typer.Option(
        "1f1b", "--pp-schedule", click_type=Choice(PP_SCHEDULES), help="Pipeline schedule."
    ),
    vpp: int = typer.Option(
        1, "--vpp", click_type=COUNT, help="Virtual stages per pipeline rank (interleaved)."
    ),
    dtype: str = DtypeOption,
    optimizer: str = OptimizerOption,
    recompute: str = RecomputeOption,
    offload: str = typer.Option(
        "none", "--offload", click_type=Choice(OFFLOADS), help="CPU offload."
    ),
    overhead: str = typer.Option(
        "0", "--overhead", help="Allocator/framework overhead item per GPU."
    ),
    kv_replicate: bool = typer.Option(
        True, "--kv-replicate/--no-kv-replicate", help="Replicate KV heads when fewer than tp."
    ),
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help="[COUNTx]GPU: say whether the layout fits on these GPUs, and by how much "
        "(H100, or 16xH100 where the layout has 16 ranks).",
    ),
    as_json: JsonDocument = False,
    results: Path | None = ResultsOption,
) -> None:
    """T2: one layout's per-rank memory by item, whether it fits on a GPU, and what it puts on
    the wire."""
    spec = get_spec(model)
    if dp * tp * pp * cp > MAX_WORLD:
        raise UsageError(f"dp x tp x pp x cp = {dp * tp * pp * cp} ranks: at most {MAX_WORLD}")
    topo = Topology.from_degrees(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    gpu_spec = gpu_type(gpus, world=topo.world_size)[1] if gpus else None
    overhead_b = size(overhead, "--overhead")
    led = predict(
        spec, strategy=strategy, topology=topo, micro_batch=micro_batch,
        seq_len=seq or min(spec.max_seq_len, 4096), dtype=dtype, optimizer=optimizer,
        recompute=recompute, pp_schedule=pp_schedule, microbatches=micro_batches,
        virtual_stages=vpp, sp=sp, shard_size=shard_size, offload=offload,
        overhead_bytes=overhead_b, impl=Implementation(kv_replicate=kv_replicate),
    )  # fmt: skip
    k = led.knobs
    wire = traffic(
        spec, topo, strategy, micro_batch=micro_batch, seq_len=k["seq_len"], dtype=dtype,
        microbatches=micro_batches, sp=sp, shard_size=shard_size, virtual_stages=vpp,
    )  # fmt: skip
    doc = ledger_document(spec, strategy, topo, led, wire, gpu_spec)
    write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
        return
    title = (
        f"{spec.name}, {strategy} over world {topo.world_size} "
        f"(dp {dp}, tp {tp}, pp {pp}, cp {cp}, ep {ep}), micro-batch {micro_batch} x seq "
        f"{k['seq_len']}, {k['dtype']}, {optimizer}, recompute {recompute}"
    )
    print_ledger(title, led, wire, gpu_spec)


def print_ledger(title: str, led: Ledger, wire: list[Any], gpu: GPUSpec | None) -> None:
    """Whether it fits on ``gpu`` (if given), the layout in one line, the ledger, the wire."""
    if gpu is not None:
        console.print(fits_line(led, gpu))
    console.print(title)
    console.print(ledger_table(led, "per-rank ledger"))
    print_wire(wire)


def fits_line(led: Ledger, gpu: GPUSpec) -> str:
    """Whether the layout's largest per-rank peak fits on ``gpu``, and by how much."""
    peak, cap = led.peak_bytes, gpu.memory_bytes
    where = f"one {gpu.name} ({format_bytes(cap)})"
    if peak <= cap:
        return (
            f"[green]fits on {where}[/green]: peak {format_bytes(peak)} per rank, "
            f"{format_bytes(cap - peak)} ({100 * (cap - peak) / cap:.0f} %) to spare"
        )
    return (
        f"[red]does not fit on {where}[/red]: peak {format_bytes(peak)} per rank, "
        f"{format_bytes(peak - cap)} ({100 * (peak - cap) / cap:.0f} %) over"
    )


def ledger_document(
    spec: Any, strategy: str, topo: Topology, led: Ledger, wire: list, gpu: GPUSpec | None
) -> contract.Document:
    k = led.knobs
    few = topo.world_size <= 1024  # per-rank lists for a layout of a few ranks, not a million
    metrics = {
        "peak_memory": contract.Metric(
            value=led.peak_bytes, unit="B", per_rank=led.per_rank() if few else None
        ),
        "state_bytes": contract.Metric(
            value=led.state_bytes(), unit="B", per_rank=_state_per_rank(led) if few else None
        ),
        "wire_bytes_per_step": contract.Metric(value=sum(w.total_bytes for w in wire), unit="B"),
        "blocking_wire_bytes_per_step": contract.Metric(
            value=sum(w.total_bytes for w in wire if w.blocking), unit="B"
        ),
    }
    if gpu is not None:
        metrics["gpu_memory"] = contract.Metric(value=gpu.memory_bytes, unit="B")
        metrics["fits"] = contract.Metric(
            value=int(led.peak_bytes <= gpu.memory_bytes), unit="bool"
        )
        metrics["headroom"] = contract.Metric(value=gpu.memory_bytes - led.peak_bytes, unit="B")
    for it in led.items:
        metrics[f"ledger_{it.name}"] = contract.Metric(
            value=it.bytes,
            unit="B",
            per_rank=led.per_rank(it.name) if few else None,
        )
    names = ("micro_batch", "seq_len", "microbatches", "dtype", "optimizer", "recompute")
    return contract.Document(
        run_id=contract.new_run_id(f"ledger-{spec.name}-{strategy}"),
        created=contract.now_iso(),
        project=PROJECT,
        task="T2",
        role="candidate",
        evidence_level="analytic",
        command=reproduce_command(),
        environment=analytic_environment(),
        workload={"model": spec.to_json(), **{n: k[n] for n in names}},
        layout={
            **topo.to_json(),
            "strategy": strategy,
            "gpu": gpu.name if gpu is not None else None,
            "knobs": k,
            "ledger": led.to_json(),
            "wire": [w.to_json() for w in wire],
        },
        metrics=metrics,
        notes=list(led.notes),
    )


def print_wire(wire: list) -> None:
    if not wire:
        console.print("nothing on the wire (one rank)")
        return
    t = Table(title="on the wire per step (payload as nccl-tests counts it)", title_justify="left")
    for c in ("collective", "axis", "group", "payload", "count / step", "total", "phase",
              "waits?", "what"):  # fmt: skip
        t.add_column(c)
    for w in wire:
        t.add_row(
            w.collective, w.axis, str(w.group_size), format_bytes(w.payload_bytes),
            str(w.count_per_step), format_bytes(w.total_bytes), w.phase,
            "yes" if w.blocking else "overlaps", w.note,
        )  # fmt: skip
    console.print(t)
    console.print(f"sync points: {len(sync_points(wire))} kinds of blocking collective")


@app.command("models")
def models_cmd(as_json: JsonPrint = False) -> None:
    """The model catalog: published architectures and training presets, with their counts."""
    specs = [get_spec(n) for n in list_specs()]
    if as_json:
        print_json([s.to_json() for s in specs])
        return
    t = Table(title="model catalog", title_justify="left")
    for c in ("name", "params", "active", "layers", "hidden", "heads / kv", "ffn", "attention",
              "vocab", "source"):  # fmt: skip
        t.add_column(c, justify="left" if c in ("name", "attention", "source") else "right")
    for s in specs:
        m = s.moe
        ffn = (
            str(s.ffn_hidden)
            if m is None
            else f"{m.num_experts}x{m.expert_ffn_hidden} top{m.top_k}"
        )
        t.add_row(
            s.name, f"{s.num_params() / 1e9:.3f}B", f"{s.num_active_params() / 1e9:.3f}B",
            str(s.layers), str(s.hidden), f"{s.heads} / {s.n_kv_heads}", ffn,
            f"{s.attention_kind} {s.activation}", str(s.vocab_size), s.source,
        )  # fmt: skip
    console.print(t)
