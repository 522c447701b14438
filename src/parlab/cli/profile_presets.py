"""``parlab profile ddp | ddp-buckets | fsdp | tp``: the preset sweeps, each a set of profiled runs
of the reference model and a plot (``parlab.profile.sweep``), on one node or several."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from parlab.cli.common import (
    COUNT,
    POSITIVE,
    Backend,
    MicroBatch,
    NnodesOption,
    NodeRankOption,
    Nproc,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    TimeoutOption,
    nodes,
    reproduce_command,
    results_dir,
    say_error,
)
from parlab.cli.profile import ScheduleOption, TraceDirOption, print_outcomes, profile_app
from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.runtime.launch import default_timeout_s, on_nodes


def run_preset(
    preset: str,
    flags: dict[str, Any],
    params: dict[str, Any],
    *,
    project: str,
    plot: tuple[str, str] | None,
) -> None:
    """Run a preset sweep (``parlab.profile.sweep``) of the reference model on the job's nodes,
    print it, exit 1 if the run failed. ``flags``: the command's flags by name (its
    ``locals()``); ``params``: the preset's own settings, after the model's shape."""
    from parlab.profile.sweep import run_sweep  # lazy: torch

    job = nodes(
        flags["nnodes"],
        flags["node_rank"],
        flags["rdzv_endpoint"],
        flags["rdzv_backend"],
        flags["rdzv_id"],
    )
    nproc, backend, timeout = flags["nproc"], flags["backend"], flags["timeout"]
    if timeout is None:
        timeout = default_timeout_s(nproc or 1, backend)
    if nproc is not None:
        nproc *= job.nnodes
    elif job.multi:
        raise UsageError("on several nodes give --nproc (ranks on each node)")
    kwargs = {"model": flags["model"], "batch": flags["batch"], "seq": flags["seq"], **params}
    with on_nodes(job):
        res = run_sweep(
            preset,
            kwargs,
            nproc=nproc,
            backend=backend,
            timeout=timeout,
            results=results_dir(flags["results"]),
            trace_dir=flags["trace_dir"],
            schedule=flags["schedule"],
            project=project,
            command=reproduce_command(),
            plot=plot,
        )
    if res.failure is not None:
        f = res.failure
        say_error(f"profile preset {preset} failed ({f.kind}, rank {f.rank}): {f.message}")
        say_error(f"wrote {res.failure_path} (failure document)")
        raise typer.Exit(1)
    if res.sweep_png is not None:
        say_error(f"sweep plot: {res.sweep_png}")
    print_outcomes(res.outcomes)


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v <= 0 for v in vals):
        raise UsageError(
            f"{what} {text!r} is not a comma-separated list of positive numbers, e.g. 1,25,100"
        )
    return vals


def _check_shape(model: str, batch: int, seq: int) -> None:
    spec = get_spec(model)
    if batch < 1 or seq < 2:
        raise UsageError(f"--micro-batch {batch} / --seq {seq}: need micro-batch >= 1, seq >= 2")
    if seq > spec.max_seq_len:
        raise UsageError(f"--seq {seq} is longer than {model}'s max_seq_len {spec.max_seq_len}")


ModelOption = typer.Option("tiny", help="Reference model spec (tiny, small, 1.3b, ...).")
SeqOption = typer.Option(64, click_type=COUNT, help="Sequence length.")


@profile_app.command("ddp-buckets")
def ddp_buckets_cmd(
    buckets: str = typer.Option("1,5,25", help="bucket_cap_mb values, comma-separated."),
    model: str = ModelOption,
    batch: MicroBatch = 2,
    seq: int = SeqOption,
    nproc: Nproc = None,
    backend: Backend = "auto",
    schedule: str = ScheduleOption,
    timeout: float | None = TimeoutOption,
    trace_dir: Path | None = TraceDirOption,
    results: Path | None = ResultsOption,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """DDP bucket-size sweep: exposed communication against bucket_cap_mb (torch DDP, reference model)."""
    _check_shape(model, batch, seq)
    run_preset(
        "ddp-buckets",
        locals(),
        {"buckets_mb": _floats(buckets, "--buckets")},
        project="PAR-TRAINING-STATE",
        plot=("DDP: exposed communication vs bucket_cap_mb", "bucket_cap_mb"),
    )


@profile_app.command("ddp")
def ddp_cmd(
    bucket_mb: float = typer.Option(25.0, click_type=POSITIVE, help="DDP bucket_cap_mb."),
    model: str = ModelOption,
    batch: MicroBatch = 2,
    seq: int = SeqOption,
    nproc: Nproc = None,
    backend: Backend = "auto",
    schedule: str = ScheduleOption,
    timeout: float | None = TimeoutOption,
    trace_dir: Path | None = TraceDirOption,
    results: Path | None = ResultsOption,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """Profile one DDP run of the reference model."""
    _check_shape(model, batch, seq)
    run_preset(
        "ddp",
        locals(),
        {"buckets_mb": _floats(str(bucket_mb), "--bucket-mb")},
        project="PAR-TRAINING-STATE",
        plot=None,
    )


FSDP_CONFIGS = {
    "noprefetch-reshard": {"prefetch": False, "reshard_after_forward": True},
    "prefetch-reshard": {"prefetch": True, "reshard_after_forward": True},
    "noprefetch-keep": {"prefetch": False, "reshard_after_forward": False},
    "prefetch-keep": {"prefetch": True, "reshard_after_forward": False},
}


@profile_app.command("fsdp")
def fsdp_cmd(
    configs: str = typer.Option(
        ",".join(FSDP_CONFIGS),
        help="FSDP2 settings to compare, comma-separated: " + ", ".join(FSDP_CONFIGS) + ".",
    ),
    model: str = ModelOption,
    batch: MicroBatch = 2,
    seq: int = SeqOption,
    nproc: Nproc = None,
    backend: Backend = "auto",
    schedule: str = ScheduleOption,
    timeout: float | None = TimeoutOption,
    trace_dir: Path | None = TraceDirOption,
    results: Path | None = ResultsOption,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """FSDP2 with and without explicit prefetch and reshard_after_forward."""
    _check_shape(model, batch, seq)
    names = [c.strip() for c in configs.split(",") if c.strip()]
    bad = [c for c in names if c not in FSDP_CONFIGS]
    if bad or not names:
        raise UsageError(f"--configs {configs!r}: use some of {', '.join(FSDP_CONFIGS)}")
    run_preset(
        "fsdp",
        locals(),
        {"configs": [FSDP_CONFIGS[c] for c in names]},
        project="PAR-TRAINING-STATE",
        plot=("FSDP2: prefetch and reshard_after_forward", "setting"),
    )


@profile_app.command("tp")
def tp_cmd(
    model: str = ModelOption,
    batch: MicroBatch = 2,
    seq: int = SeqOption,
    nproc: Nproc = None,
    backend: Backend = "auto",
    schedule: str = ScheduleOption,
    timeout: float | None = TimeoutOption,
    trace_dir: Path | None = TraceDirOption,
    results: Path | None = ResultsOption,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """Tensor parallelism over all ranks, without and with sequence parallelism."""
    _check_shape(model, batch, seq)
    from parlab.profile.sweep import default_nproc  # lazy: torch

    nproc = nproc or default_nproc()
    if seq % (nproc * nnodes):
        raise UsageError(
            f"--seq {seq} must divide by the {nproc * nnodes} TP ranks for sequence parallelism"
        )
    run_preset(
        "tp",
        locals(),
        {"sequence_parallel": [False, True]},
        project="PAR-MODEL-INTERNAL",
        plot=("TP: without and with sequence parallelism", "setting"),
    )
