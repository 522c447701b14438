"""Analytic commands: ``parlab fit`` (T0), ``parlab ledger`` (T2's per-rank ledger), ``parlab models``.

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
from rich.console import Console
from rich.table import Table

from parlab import contract
from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    Choice,
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
from parlab.ledger import OPTIMIZERS, Ledger, predict
from parlab.ledger.activations import PP_SCHEDULES
from parlab.ledger.fit import Candidate, FitResult, fit
from parlab.ledger.predict import OFFLOADS, STRATEGIES
from parlab.ledger.traffic import sync_points, traffic
from parlab.models import get_spec
from parlab.models.flops import forward_flops_per_token, training_flops_per_token
from parlab.topology import Topology
from parlab.units import format_bytes, parse_cluster

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


def _environment() -> dict[str, Any]:
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


def fit_document(res: FitResult, *, command: str, workload: dict[str, Any]) -> contract.Document:
    spec = res.spec
    best = res.candidates[0] if res.candidates else None
    seq = workload["seq_len"]
    metrics = {
        "single_gpu_peak": contract.Metric(value=res.single.peak_bytes, unit="B"),
        "single_gpu_fits": contract.Metric(value=1 if res.single_fits else 0, unit="bool"),
        "gpu_memory": contract.Metric(value=res.capacity_bytes, unit="B"),
        "params": contract.Metric(value=spec.num_params(), unit="count"),
        "active_params": contract.Metric(value=spec.num_active_params(), unit="count"),
        "training_flops_per_token": contract.Metric(
            value=training_flops_per_token(spec, seq), unit="FLOP"
        ),
        "forward_flops_per_token": contract.Metric(
            value=forward_flops_per_token(spec, seq), unit="FLOP"
        ),
        "layouts_considered": contract.Metric(value=res.considered, unit="count"),
        "candidates_fitting": contract.Metric(value=len(res.candidates), unit="count"),
        "min_gpus": contract.Metric(value=1 if res.single_fits else res.world_size, unit="count"),
        "best_candidate_peak": contract.Metric(
            value=best.ledger.peak_bytes if best else None, unit="B"
        ),
    }
    layout = {
        "world_size": 1,
        "mesh": {"pp": 1, "dp": 1, "cp": 1, "tp": 1, "ep": 1},
        "strategy": "single-gpu",
        "gpu": res.gpu.name,
        "single_gpu_ledger": res.single.to_json(),
        "candidates_world_size": res.world_size,
        "recommended": best.name if best else None,
        "candidates": [c.to_json() for c in res.best_per_family(12)],
    }
    notes = [
        f"fits = predicted peak + allocator_overhead ({format_bytes(res.overhead_bytes)}) "
        f"<= {format_bytes(res.capacity_bytes)} of one {res.gpu.name}",
        "candidates: the best layout of each family (strategy x axes used), ranked by blocking "
        "bytes per micro-batch, then all bytes per step, then peak memory; the first is the "
        "recommendation",
        *res.single.notes,
    ]
    return contract.Document(
        run_id=contract.new_run_id(f"fit-{spec.name}"),
        created=contract.now_iso(),
        project=PROJECT,
        task="T0",
        role="baseline",
        evidence_level="analytic",
        command=command,
        environment=_environment(),
        workload=workload,
        layout=layout,
        metrics=metrics,
        notes=notes,
    )


SORT_KEY = "blocking comm / micro-batch, then all comm / step, then peak / rank"
COLUMNS = (
    ("peak / rank", "the predicted peak memory of one GPU (fits: peak + overhead <= its memory)"),
    ("states", "parameters, gradients, optimizer states (and fp32 master) one rank holds"),
    ("activations", "what forward keeps for backward, per rank"),
    ("blocking / micro-batch", "bytes of collectives compute must wait for, per micro-batch: "
     "the sort key (pipeline layouts run more micro-batches per step)"),
    ("all comm / step", "bytes of every collective per optimizer step (nccl-tests sizes), "
     "overlapped or not"),
    ("sync points", "blocking collectives per step: each is a point where every rank of a "
     "group waits for the slowest one"),
)  # fmt: skip


def _sync_count(c: Candidate) -> int:
    return sum(w.count_per_step for w in c.wire if w.blocking)


def print_fit(res: FitResult, out: Console, *, top: int) -> None:
    spec = res.spec
    seq = res.single.knobs["seq_len"]
    _print_verdict(res, out)
    out.print(
        f"{spec.name}: {spec.num_params() / 1e9:.2f}B parameters "
        f"({spec.num_active_params() / 1e9:.2f}B active), {spec.layers} layers, hidden {spec.hidden}, "
        f"{spec.heads} heads ({spec.attention_kind}, {spec.n_kv_heads} KV)"
    )
    out.print(
        f"training FLOPs per token at seq {seq}: {training_flops_per_token(spec, seq):.3e} "
        f"(6N + 12 L H Q T); forward {forward_flops_per_token(spec, seq):.3e}"
    )
    out.print(ledger_table(res.single, f"one {res.gpu.name} ({format_bytes(res.capacity_bytes)})"))
    if not res.candidates:
        return
    t = Table(
        title=f"split candidates that fit on {res.world_size} x {res.gpu.name} "
        f"({res.considered} layouts evaluated; the best of each family, sorted by {SORT_KEY})",
        title_justify="left",
    )
    t.add_column("#", justify="right")
    t.add_column("candidate")
    for name, _ in COLUMNS:
        t.add_column(name, justify="right")
    shown = res.best_per_family(top)
    for i, c in enumerate(shown, 1):
        t.add_row(
            f"{i}{' *' if i == 1 else ''}",
            c.name,
            format_bytes(c.ledger.peak_bytes),
            format_bytes(c.ledger.state_bytes()),
            format_bytes(c.ledger.value("activations")),
            format_bytes(c.blocking_per_microbatch),
            format_bytes(c.wire_bytes),
            str(_sync_count(c)),
        )
    out.print(t)
    out.print("* recommended; the columns:", markup=False)
    for name, meaning in COLUMNS:
        out.print(f"  {name}: {meaning}", markup=False)
    for c in shown[:3]:
        out.print(f"[b]{c.name}[/b] adds:")
        for w in c.wire:
            kind = "waits" if w.blocking else "overlaps"
            out.print(
                f"  {w.collective} over {w.axis} ({w.group_size} ranks), {w.phase}: "
                f"{w.count_per_step} x {format_bytes(w.payload_bytes)} per step [{kind}] - {w.note}",
                markup=False,
            )


def _print_verdict(res: FitResult, out: Console) -> None:
    """The answer first: fits or not, and the recommended split."""
    need = res.single.peak_bytes + res.overhead_bytes
    gpu = f"one {res.gpu.name} ({format_bytes(res.capacity_bytes)})"
    if res.single_fits:
        out.print(
            f"[green]fits on {gpu}[/green]: needs {format_bytes(need)}, "
            f"{format_bytes(res.capacity_bytes - need)} to spare"
        )
    else:
        out.print(
            f"[red]does not fit on {gpu}[/red]: needs {format_bytes(need)}, "
            f"{format_bytes(need - res.capacity_bytes)} over"
        )
    if not res.candidates:
        if not res.single_fits:
            out.print(
                f"no layout fits up to the searched world sizes ({res.considered} layouts tried): "
                "try --recompute full, a smaller --micro-batch or --seq, or more GPUs (--max-gpus)"
            )
        return
    best = res.candidates[0]
    out.print(
        f"recommended on {res.world_size} x {res.gpu.name}: [b]{best.name}[/b] -- peak "
        f"{format_bytes(best.ledger.peak_bytes)} per GPU, the least communication compute waits "
        f"for ({format_bytes(best.blocking_per_microbatch)} per micro-batch, "
        f"{_sync_count(best)} sync points per step)"
    )


@app.command("fit")
def fit_cmd(
    model: str = ModelArgument,
    gpus: str = typer.Option(
        "H100",
        "--gpus",
        help="[COUNTx]GPU: a catalog GPU (H100, H200, A100-80GB, ...); with a count, search "
        "layouts at exactly that many (8xH100), else up to --max-gpus.",
    ),
    max_gpus: int = typer.Option(
        1024, "--max-gpus", click_type=COUNT, help="Largest world size searched (powers of two)."
    ),
    seq: int | None = typer.Option(
        None, "--seq", click_type=COUNT, help="Sequence length (default: min(max_seq, 4096))."
    ),
    micro_batch: int = typer.Option(
        1, "--micro-batch", click_type=COUNT, help="Sequences per rank per micro-batch."
    ),
    dtype: str = DtypeOption,
    optimizer: str = OptimizerOption,
    recompute: str = RecomputeOption,
    overhead: str = typer.Option(
        "1GiB", "--overhead", help="Allocator/framework overhead item per GPU."
    ),
    gpus_per_node: int = typer.Option(
        8, "--gpus-per-node", click_type=COUNT, help="TP stays within a node."
    ),
    top: int = typer.Option(8, "--top", click_type=COUNT, help="Candidates shown."),
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    results: Path | None = ResultsOption,
) -> None:
    """T0: whether a model fits on one GPU, its memory breakdown, and the splits that would fit,
    sorted, with the one to use."""
    spec = get_spec(model)
    count, gpu_spec = gpu_type(gpus)
    overhead_b = size(overhead, "--overhead")
    res = fit(
        spec, gpu=gpu_spec, gpus=count, max_gpus=max_gpus, micro_batch=micro_batch, seq_len=seq,
        dtype=dtype, optimizer=optimizer, recompute=recompute, overhead_bytes=overhead_b,
        gpus_per_node=gpus_per_node,
    )  # fmt: skip
    workload = {
        "model": spec.to_json(),
        "micro_batch": micro_batch,
        "seq_len": res.single.knobs["seq_len"],
        "dtype": res.single.knobs["dtype"],
        "optimizer": optimizer,
        "recompute": recompute,
        "overhead_bytes": overhead_b,
    }
    doc = fit_document(res, command=reproduce_command(), workload=workload)
    write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
    else:
        print_fit(res, console, top=top)


def _state_per_rank(led: Ledger) -> list[int]:
    cols = [led.per_rank(n) for n in ("params", "grads", "optimizer", "master_params")]
    return [sum(x) for x in zip(*cols, strict=True)]


@app.command("ledger")
def ledger_cmd(
    model: str = ModelArgument,
    strategy: str = typer.Option("ddp", "--strategy", click_type=Choice(STRATEGIES)),
    dp: int = typer.Option(1, "--dp", click_type=COUNT, help="Data-parallel degree."),
    tp: int = typer.Option(1, "--tp", click_type=COUNT, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", click_type=COUNT, help="Pipeline-parallel degree."),
    cp: int = typer.Option(1, "--cp", click_type=COUNT, help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", click_type=COUNT, help="Expert-parallel degree (splits dp)."),
    shard_size: int | None = typer.Option(
        None, "--shard-size", click_type=COUNT, help="fsdp-hybrid: ranks per shard group."
    ),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism with TP."),
    seq: int | None = typer.Option(
        None, "--seq", click_type=COUNT, help="Sequence length (default: min(max_seq, 4096))."
    ),
    micro_batch: int = typer.Option(
        1, "--micro-batch", click_type=COUNT, help="Sequences per rank per micro-batch."
    ),
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
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    results: Path | None = ResultsOption,
) -> None:
    """T2: one layout's per-rank memory by item, whether it fits on a GPU, and what it puts on
    the wire."""
    spec = get_spec(model)
    topo = Topology.from_degrees(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    gpu_spec = gpu_type(gpus, world=topo.world_size)[1] if gpus else None
    overhead_b = size(overhead, "--overhead")
    led = predict(
        spec, strategy=strategy, topology=topo, micro_batch=micro_batch,
        seq_len=seq or min(spec.max_seq_len, 4096), dtype=dtype, optimizer=optimizer,
        recompute=recompute, pp_schedule=pp_schedule, microbatches=micro_batches,
        virtual_stages=vpp, sp=sp, shard_size=shard_size, offload=offload,
        overhead_bytes=overhead_b, kv_replicate=kv_replicate,
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
    if gpu_spec is not None:
        console.print(fits_line(led, gpu_spec))
    console.print(
        f"{spec.name}, {strategy} over world {topo.world_size} "
        f"(dp {dp}, tp {tp}, pp {pp}, cp {cp}, ep {ep}), micro-batch {micro_batch} x seq "
        f"{k['seq_len']}, {k['dtype']}, {optimizer}, recompute {recompute}"
    )
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
    metrics = {
        "peak_memory": contract.Metric(value=led.peak_bytes, unit="B", per_rank=led.per_rank()),
        "state_bytes": contract.Metric(
            value=led.state_bytes(), unit="B", per_rank=_state_per_rank(led)
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
            per_rank=led.per_rank(it.name) if topo.world_size <= 1024 else None,
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
        environment=_environment(),
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
def models_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The model catalog: published architectures and training presets, with their counts."""
    from parlab.models import list_specs

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


def demo_step(results: Path, console: Console) -> None:
    """T0 demo: ``parlab fit llama3.1-8b --gpus H100`` (analytic, milliseconds)."""
    spec = get_spec("llama3.1-8b")
    gpu = require("H100")
    res = fit(spec, gpu=gpu, seq_len=4096, overhead_bytes=2**30, dtype="bf16-compute")
    workload = {
        "model": spec.to_json(), "micro_batch": 1, "seq_len": 4096, "dtype": "bf16-compute",
        "optimizer": "adamw", "recompute": "none", "overhead_bytes": 2**30,
    }  # fmt: skip
    doc = fit_document(
        res, command=f"parlab fit llama3.1-8b --gpus H100 --seq 4096 --results {results}",
        workload=workload,
    )  # fmt: skip
    write(doc, results)
    print_fit(res, console, top=5)
