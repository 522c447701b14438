"""``parlab fit`` (T0): whether a model fits on one GPU, its memory breakdown, and the splits that
would fit, sorted, the recommended one first, with the communication each adds.

Analytic (``parlab.ledger.fit``): nothing is launched; one ``analytic`` document under
PAR-TRAINING-STATE. The verdict comes first, then the breakdown, then the candidates,
whose columns are explained under their table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from parlab import contract
from parlab.cli import app
from parlab.cli.analytic import (
    PROJECT,
    DtypeOption,
    ModelArgument,
    OptimizerOption,
    RecomputeOption,
    analytic_environment,
    gpu_type,
    ledger_table,
)
from parlab.cli.common import (
    COUNT,
    RANKS,
    JsonDocument,
    MicroBatch,
    ResultsOption,
    console,
    print_json,
    reproduce_command,
    results_dir,
    size,
    write,
)
from parlab.hardware.catalog import require
from parlab.ledger.fit import FitLayout, FitResult, fit
from parlab.models import get_spec
from parlab.models.flops import forward_flops_per_token, training_flops_per_token
from parlab.units import format_bytes


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
        environment=analytic_environment(),
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


def _sync_count(c: FitLayout) -> int:
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
        1024, "--max-gpus", click_type=RANKS, help="Largest world size searched (powers of two)."
    ),
    seq: int | None = typer.Option(
        None, "--seq", click_type=COUNT, help="Sequence length (default: min(max_seq, 4096))."
    ),
    micro_batch: MicroBatch = 1,
    dtype: str = DtypeOption,
    optimizer: str = OptimizerOption,
    recompute: str = RecomputeOption,
    overhead: str = typer.Option(
        "1GiB", "--overhead", help="Allocator/framework overhead item per GPU."
    ),
    gpus_per_node: int = typer.Option(
        8, "--gpus-per-node", click_type=RANKS, help="TP stays within a node."
    ),
    top: int = typer.Option(8, "--top", click_type=COUNT, help="Candidates shown."),
    as_json: JsonDocument = False,
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
