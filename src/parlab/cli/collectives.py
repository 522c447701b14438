"""``parlab collectives``: the T1 sweep (default), its alpha-beta fit (``--fit``) and the T1
explain table (``--explain``).

The sweep runs in ``collectives_sweep.py``: nccl-tests' table, a ``real-nccl`` /
``cpu-mechanism`` document and a busbw plot; the ranks' environment is
``parlab.comm.sweep.rank_env``'s, and ``--via nccl`` issues the ops through
``parlab.comm.nccl_direct``. ``--fit`` writes the calibration document the planner loads
(``parlab.comm.calibration.load_calibration``); ``--explain`` gives, per strategy of the
layout, the collective, mesh axis, payload, frequency per step and predicted time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from parlab.cli import app
from parlab.cli.collectives_sweep import sweep
from parlab.cli.common import (
    COUNT,
    Backend,
    Choice,
    JsonDocument,
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
    print_json,
    reproduce_command,
    results_dir,
    say,
    tensor_dtype_choice,
    write,
)
from parlab.contract import read_document, read_results
from parlab.errors import UsageError
from parlab.ledger import STRATEGIES
from parlab.runtime.launch import on_nodes
from parlab.units import parse_cluster

Op = Annotated[
    str,
    typer.Option(
        "--op",
        help="Ops, comma-separated (all_reduce, all_gather, reduce_scatter, "
        "all_to_all, all_to_all_uneven, broadcast, reduce, send_recv, barrier) or 'all'.",
    ),
]
MinBytes = Annotated[str, typer.Option("-b", "--minbytes", help="Smallest size (8, 64KiB, 1M).")]
MaxBytes = Annotated[
    str | None,
    typer.Option(
        "-e",
        "--maxbytes",
        help="Largest size (default 32MiB on GPUs as nccl-tests, 1MiB on CPU).",
    ),
]
StepFactor = Annotated[
    int, typer.Option("-f", "--stepfactor", click_type=COUNT, help="Multiply the size by this.")
]
TensorDtype = Annotated[
    str,
    typer.Option("-d", "--tensor-dtype", click_type=tensor_dtype_choice(), help="Element type."),
]
Warmup = Annotated[
    int,
    typer.Option("-w", "--warmup-iters", click_type=COUNT, help="Untimed iterations per size."),
]
Iters = Annotated[
    int, typer.Option("-n", "--iters", click_type=COUNT, help="Timed iterations per size.")
]
Inplace = Annotated[
    bool,
    typer.Option("--inplace/--out-of-place", help="In-place all_gather / reduce_scatter buffers."),
]
Mesh = Annotated[str | None, typer.Option("--mesh", help="Mesh degrees, e.g. dp=2,tp=4.")]
Axis = Annotated[
    str | None, typer.Option("--axis", help="Measure the groups along this mesh axis.")
]
Graph = Annotated[
    bool,
    typer.Option(
        "--graph",
        help="Time CUDA-graph replays of the loop (GPUs; NCCL_GRAPH_MIXING_SUPPORT=0 unless set).",
    ),
]
Via = Annotated[
    str,
    typer.Option(
        "--via",
        click_type=Choice(("torch", "nccl")),
        help="Who issues the ops: torch (c10d, what training calls) or nccl (NCCL itself "
        "through ctypes; GPUs; no barrier). The difference is c10d's cost per call.",
    ),
]
Fit = Annotated[
    Path | None,
    typer.Option(
        "--fit", help="Fit alpha-beta to this sweep document (or the newest in a folder)."
    ),
]
Explain = Annotated[str | None, typer.Option("--explain", help="T1 table for this model.")]
Layout = Annotated[str | None, typer.Option("--layout", help="With --explain: dp=8,tp=2 ...")]
Strategy = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        click_type=Choice(STRATEGIES),
        help="With --explain: the data-parallel strategy (default ddp).",
    ),
]
MicroBatch = Annotated[
    int,
    typer.Option("--micro-batch", click_type=COUNT, help="With --explain: sequences per rank."),
]
Seq = Annotated[
    int | None,
    typer.Option("--seq", click_type=COUNT, help="With --explain: sequence length."),
]
MicroBatches = Annotated[
    int,
    typer.Option(
        "--micro-batches",
        click_type=COUNT,
        help="With --explain: micro-batches per step (accumulation, PP).",
    ),
]
Sp = Annotated[bool, typer.Option("--sp", help="With --explain: sequence parallelism on tp.")]
ShardSize = Annotated[
    int | None,
    typer.Option(
        "--shard-size",
        click_type=COUNT,
        help="With --explain --strategy fsdp-hybrid: ranks per shard group.",
    ),
]
Calibration = Annotated[
    Path | None,
    typer.Option("--calibration", help="With --explain: calibration document or results folder."),
]
Gpus = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="With --explain and no calibration: [COUNTx]GPU from the catalog (default: this "
        "machine's).",
    ),
]


@app.command("collectives")
def collectives_cmd(
    op: Op = "all",
    minbytes: MinBytes = "8",
    maxbytes: MaxBytes = None,
    stepfactor: StepFactor = 2,
    dtype: TensorDtype = "fp32",
    warmup: Warmup = 5,
    iters: Iters = 20,
    inplace: Inplace = False,
    mesh: Mesh = None,
    axis: Axis = None,
    graph: Graph = False,
    via: Via = "torch",
    nproc: Nproc = None,
    backend: Backend = "auto",
    timeout: float | None = TimeoutOption,
    fit: Fit = None,
    explain: Explain = None,
    layout: Layout = None,
    strategy: Strategy = None,
    micro_batch: MicroBatch = 1,
    seq: Seq = None,
    micro_batches: MicroBatches = 1,
    sp: Sp = False,
    shard_size: ShardSize = None,
    calibration: Calibration = None,
    gpus: Gpus = None,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    results: Path | None = ResultsOption,
    as_json: JsonDocument = False,
) -> None:
    """T1: measure collectives (nccl-tests style), fit alpha-beta, or explain a layout's traffic."""
    if fit is not None and explain is not None:
        raise UsageError("--fit and --explain are separate modes: give one of them")
    if fit is not None:
        _fit(fit, results, as_json)
        return
    if explain is not None:
        _explain(
            explain,
            layout,
            strategy,
            micro_batch,
            seq,
            calibration,
            gpus,
            results,
            as_json,
            microbatches=micro_batches,
            sp=sp,
            shard_size=shard_size,
        )
        return
    with on_nodes(nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)):
        sweep(
            op=op,
            minbytes=minbytes,
            maxbytes=maxbytes,
            stepfactor=stepfactor,
            dtype=dtype,
            warmup=warmup,
            iters=iters,
            inplace=inplace,
            mesh=mesh,
            axis=axis,
            graph=graph,
            via=via,
            nproc=nproc,
            backend=backend,
            timeout=timeout,
            results=results,
            as_json=as_json,
        )


def _newest_sweep(folder: Path) -> Path:
    from parlab.comm.calibration import SWEEP_KIND  # lazy: numpy

    entries, _ = read_results(folder)
    sweeps = [e for e in entries if e.doc.workload.get("kind") == SWEEP_KIND]
    if not sweeps:
        raise UsageError(f"no collectives sweep under {folder}: run 'parlab collectives' first")
    # the planner predicts what training pays, through c10d: prefer --via torch sweeps
    torch_path = [e for e in sweeps if e.doc.workload["collectives"].get("via", "torch") == "torch"]
    return (torch_path or sweeps)[-1].path


def _fit(source: Path, results: Path | None, as_json: bool) -> None:
    from parlab.comm.calibration import calibration_document  # lazy: numpy

    if source.is_dir():
        source = _newest_sweep(source)
    sweep = read_document(source)
    doc = calibration_document(sweep, command=reproduce_command())
    path = write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
        return
    body = doc.workload["calibration"]
    link = body.get("link_bw")
    t = Table(
        title=f"alpha-beta fit of {sweep.run_id} ({sweep.evidence_level}, n = {body['group_size']}, "
        f"ring coefficients)",
        title_justify="left",
    )
    for c in (
        "op",
        "points",
        "alpha",
        "1/beta",
        "fit rms err",
        "fit max err",
        "busbw peak",
        "% link",
    ):
        t.add_column(c, justify="right" if c != "op" else "left")
    for op, f in body["ops"].items():
        beta = f["beta_s_per_byte"]
        t.add_row(
            op,
            str(f["points"]),
            f"{f['alpha_s'] * 1e6:.2f} us",
            f"{1 / beta / 1e9:.1f} GB/s" if beta else "-",
            f"{100 * f['rms_rel_err']:.1f}%",
            f"{100 * f['max_rel_err']:.1f}%",
            f"{f['busbw_peak'] / 1e9:.2f} GB/s" if op != "barrier" else "-",
            "-"
            if op == "barrier"
            else f"{100 * f['busbw_peak'] / link:.1f}%"
            if link
            else "unknown",
        )
    console.print(t)
    console.print(
        f"link peak: {f'{link / 1e9:.1f} GB/s' if link else 'unknown'} ({body['link_bw_source']})"
    )
    say(f"calibration: {path}")


def _explain(
    model: str,
    layout: str | None,
    strategy: str | None,
    micro_batch: int,
    seq: int | None,
    calibration: Path | None,
    gpus: str | None,
    results: Path | None,
    as_json: bool,
    *,
    microbatches: int,
    sp: bool,
    shard_size: int | None,
) -> None:
    from parlab.comm.explain import explain_document, format_explain  # lazy: numpy

    gpu = None if gpus is None else parse_cluster(gpus, "--gpus", count=False)[1]
    if not layout:
        raise UsageError("--explain needs --layout (e.g. --layout dp=8,tp=2)")
    doc = explain_document(
        model_name=model,
        layout=layout,
        strategy=strategy,
        micro_batch=micro_batch,
        seq=seq,
        calibration=calibration,
        gpu=gpu,
        microbatches=microbatches,
        sp=sp,
        shard_size=shard_size,
        command=reproduce_command(),
    )
    path = write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
        return
    format_explain(doc, console)
    say(f"document: {path}")
