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
    ResultsOption,
    console,
    print_json,
    reproduce_command,
    results_dir,
    write,
)
from parlab.errors import UsageError
from parlab.hardware.catalog import require
from parlab.ledger import Ledger, predict
from parlab.ledger.fit import FitResult, fit
from parlab.ledger.traffic import sync_points, traffic
from parlab.models import get_spec
from parlab.models.flops import forward_flops_per_token, training_flops_per_token
from parlab.topology import Topology
from parlab.units import format_bytes, parse_size

PROJECT = "PAR-TRAINING-STATE"


def _size(text: str, field: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{field}: {exc}") from None


def _positive(**values: int | None) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise UsageError(f"--{name} {v}: give a whole number of at least 1")


def _environment() -> dict[str, Any]:
    from parlab.hardware.env import snapshot

    return snapshot(probe_links=False)


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
        "candidates": [c.to_json() for c in res.best_per_family(12)],
    }
    notes = [
        f"fits = predicted peak + allocator_overhead ({format_bytes(res.overhead_bytes)}) "
        f"<= {format_bytes(res.capacity_bytes)} of one {res.gpu.name}",
        "candidates: the best layout of each family (strategy x axes used), ranked by blocking "
        "bytes per step, then all bytes, then peak memory",
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


def print_fit(res: FitResult, out: Console, *, top: int) -> None:
    spec = res.spec
    seq = res.single.knobs["seq_len"]
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
    if res.single_fits:
        out.print(f"[green]fits on one {res.gpu.name}[/green]")
    else:
        out.print(
            f"[red]does not fit on one {res.gpu.name}[/red]: needs {format_bytes(res.single.peak_bytes)} "
            f"of {format_bytes(res.capacity_bytes)}"
        )
    if not res.candidates:
        if not res.single_fits:
            out.print(
                f"no layout fits up to the searched world sizes ({res.considered} layouts tried): "
                "try --recompute full, a smaller --batch/--seq, or more GPUs"
            )
        return
    t = Table(
        title=f"split candidates that fit on {res.world_size} x {res.gpu.name} "
        f"({res.considered} layouts evaluated; best of each family)",
        title_justify="left",
    )
    for c in ("candidate", "peak / rank", "states", "activations", "blocking comm / step",
              "all comm / step", "sync points"):  # fmt: skip
        t.add_column(c, justify="left" if c == "candidate" else "right")
    shown = res.best_per_family(top)
    for c in shown:
        t.add_row(
            c.name,
            format_bytes(c.ledger.peak_bytes),
            format_bytes(c.ledger.state_bytes()),
            format_bytes(c.ledger.value("activations")),
            format_bytes(c.blocking_bytes),
            format_bytes(c.wire_bytes),
            str(sum(w.count_per_step for w in c.wire if w.blocking)),
        )
    out.print(t)
    for c in shown[:3]:
        out.print(f"[b]{c.name}[/b] adds:")
        for w in c.wire:
            kind = "waits" if w.blocking else "overlaps"
            out.print(
                f"  {w.collective} over {w.axis} ({w.group_size} ranks), {w.phase}: "
                f"{w.count_per_step} x {format_bytes(w.payload_bytes)} per step [{kind}] - {w.note}"
            )


@app.command("fit")
def fit_cmd(
    model: str = typer.Argument(
        ..., help="Catalog name (see parlab models) or a config.json path."
    ),
    gpu: str = typer.Option(
        "H100", "--gpu", help="GPU from the hardware catalog (H100, H200, A100-80GB, ...)."
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", help="Search layouts at exactly this many GPUs."
    ),
    max_gpus: int = typer.Option(
        1024, "--max-gpus", help="Largest world size searched (powers of two)."
    ),
    seq: int | None = typer.Option(
        None, "--seq", help="Sequence length (default: min(max_seq, 4096))."
    ),
    batch: int = typer.Option(1, "--batch", help="Micro-batch size per rank."),
    dtype: str = typer.Option(
        "bf16-mixed", "--dtype", help="fp32, bf16-mixed, bf16-master or bf16."
    ),
    optimizer: str = typer.Option(
        "adamw", "--optimizer", help="adamw, adamw-fused, sgd, sgd-momentum."
    ),
    recompute: str = typer.Option("none", "--recompute", help="none, selective or full."),
    overhead: str = typer.Option(
        "1GiB", "--overhead", help="Allocator/framework overhead item per GPU."
    ),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="TP stays within a node."),
    top: int = typer.Option(8, "--top", help="Candidates shown."),
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    results: Path | None = ResultsOption,
) -> None:
    """T0: the single-GPU memory breakdown, whether it fits, and the splits that would."""
    _positive(gpus=gpus, batch=batch, seq=seq, top=top)
    _positive(**{"max-gpus": max_gpus, "gpus-per-node": gpus_per_node})
    spec = get_spec(model)
    gpu_spec = require(gpu)
    overhead_b = _size(overhead, "--overhead")
    res = fit(
        spec, gpu=gpu_spec, gpus=gpus, max_gpus=max_gpus, micro_batch=batch, seq_len=seq,
        dtype=dtype, optimizer=optimizer, recompute=recompute, overhead_bytes=overhead_b,
        gpus_per_node=gpus_per_node,
    )  # fmt: skip
    workload = {
        "model": spec.to_json(),
        "micro_batch": batch,
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
    model: str = typer.Argument(
        ..., help="Catalog name (see parlab models) or a config.json path."
    ),
    strategy: str = typer.Option(
        "ddp", "--strategy", help="ddp, zero1, zero2, zero3, fsdp, fsdp-hybrid."
    ),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (splits dp)."),
    shard_size: int | None = typer.Option(
        None, "--shard-size", help="fsdp-hybrid: ranks per shard group."
    ),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism with TP."),
    seq: int | None = typer.Option(
        None, "--seq", help="Sequence length (default: min(max_seq, 4096))."
    ),
    batch: int = typer.Option(1, "--batch", help="Micro-batch size per rank."),
    microbatches: int = typer.Option(
        1, "--microbatches", help="Micro-batches per step (PP, or accumulation)."
    ),
    pp_schedule: str = typer.Option("1f1b", "--pp-schedule", help="gpipe, 1f1b or interleaved."),
    virtual_stages: int = typer.Option(
        1, "--virtual-stages", help="Chunks per rank (interleaved)."
    ),
    dtype: str = typer.Option(
        "bf16-mixed", "--dtype", help="fp32, bf16-mixed, bf16-master or bf16."
    ),
    optimizer: str = typer.Option(
        "adamw", "--optimizer", help="adamw, adamw-fused, sgd, sgd-momentum."
    ),
    recompute: str = typer.Option("none", "--recompute", help="none, selective or full."),
    offload: str = typer.Option(
        "none", "--offload", help="none, optimizer or params (CPU offload)."
    ),
    overhead: str = typer.Option(
        "0", "--overhead", help="Allocator/framework overhead item per GPU."
    ),
    kv_replicate: bool = typer.Option(
        True, "--kv-replicate/--no-kv-replicate", help="Replicate KV heads when fewer than tp."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    results: Path | None = ResultsOption,
) -> None:
    """T2: one layout's full per-rank ledger and what it puts on the wire."""
    _positive(batch=batch, seq=seq, microbatches=microbatches, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    _positive(**{"virtual-stages": virtual_stages, "shard-size": shard_size})
    spec = get_spec(model)
    topo = Topology.from_degrees(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    overhead_b = _size(overhead, "--overhead")
    led = predict(
        spec, strategy=strategy, topology=topo, micro_batch=batch, seq_len=seq or min(spec.max_seq_len, 4096),
        dtype=dtype, optimizer=optimizer, recompute=recompute, pp_schedule=pp_schedule,
        microbatches=microbatches, virtual_stages=virtual_stages, sp=sp, shard_size=shard_size,
        offload=offload, overhead_bytes=overhead_b, kv_replicate=kv_replicate,
    )  # fmt: skip
    k = led.knobs
    wire = traffic(
        spec, topo, strategy, micro_batch=batch, seq_len=k["seq_len"], dtype=dtype,
        microbatches=microbatches, sp=sp, shard_size=shard_size, virtual_stages=virtual_stages,
    )  # fmt: skip
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
    for it in led.items:
        metrics[f"ledger_{it.name}"] = contract.Metric(
            value=it.bytes,
            unit="B",
            per_rank=led.per_rank(it.name) if topo.world_size <= 1024 else None,
        )
    doc = contract.Document(
        run_id=contract.new_run_id(f"ledger-{spec.name}-{strategy}"),
        created=contract.now_iso(),
        project=PROJECT,
        task="T2",
        role="candidate",
        evidence_level="analytic",
        command=reproduce_command(),
        environment=_environment(),
        workload={
            "model": spec.to_json(),
            **{
                n: k[n]
                for n in (
                    "micro_batch",
                    "seq_len",
                    "microbatches",
                    "dtype",
                    "optimizer",
                    "recompute",
                )
            },
        },
        layout={
            **topo.to_json(),
            "strategy": strategy,
            "knobs": k,
            "ledger": led.to_json(),
            "wire": [w.to_json() for w in wire],
        },
        metrics=metrics,
        notes=list(led.notes),
    )
    write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
        return
    console.print(
        f"{spec.name}, {strategy} over world {topo.world_size} "
        f"(dp {dp}, tp {tp}, pp {pp}, cp {cp}, ep {ep}), micro-batch {batch} x seq {k['seq_len']}, "
        f"{k['dtype']}, {optimizer}, recompute {recompute}"
    )
    console.print(ledger_table(led, "per-rank ledger"))
    if wire:
        t = Table(
            title="on the wire per step (payload as nccl-tests counts it)", title_justify="left"
        )
        for c in (
            "collective",
            "axis",
            "group",
            "payload",
            "count / step",
            "total",
            "phase",
            "waits?",
            "what",
        ):
            t.add_column(c)
        for w in wire:
            t.add_row(
                w.collective, w.axis, str(w.group_size), format_bytes(w.payload_bytes),
                str(w.count_per_step), format_bytes(w.total_bytes), w.phase,
                "yes" if w.blocking else "overlaps", w.note,
            )  # fmt: skip
        console.print(t)
        console.print(f"sync points: {len(sync_points(wire))} kinds of blocking collective")
    else:
        console.print("nothing on the wire (one rank)")


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
    """T0 demo: ``parlab fit llama3.1-8b --gpu H100`` (analytic, milliseconds)."""
    spec = get_spec("llama3.1-8b")
    gpu = require("H100")
    res = fit(spec, gpu=gpu, seq_len=4096, overhead_bytes=2**30)
    workload = {
        "model": spec.to_json(), "micro_batch": 1, "seq_len": 4096, "dtype": "bf16-mixed",
        "optimizer": "adamw", "recompute": "none", "overhead_bytes": 2**30,
    }  # fmt: skip
    doc = fit_document(
        res, command=f"parlab fit llama3.1-8b --gpu H100 --seq 4096 --results {results}",
        workload=workload,
    )  # fmt: skip
    write(doc, results)
    print_fit(res, console, top=5)
