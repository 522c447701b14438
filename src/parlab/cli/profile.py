"""``parlab profile``: per-rank traces -> overlap, exposed communication, idle, hotspots, stragglers.

Subcommands:

- ``analyze DIR``: analyse a folder of per-rank Chrome traces (any torch.profiler output);
- ``run [--nproc N] -- script.py ARGS`` / ``run -- parlab CMD ...``: capture, then analyse;
- presets, each a sweep with a plot: ``ddp`` / ``ddp-buckets`` (exposed comm against
  ``bucket_cap_mb``), ``fsdp`` (prefetch x reshard_after_forward), ``tp`` (without and with
  sequence parallelism).

Each profiled configuration writes one T5 document and, beside it, the merged
multi-rank trace (opens in ui.perfetto.dev), the timeline PNG of one step and
the hotspot text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    POSITIVE,
    SECONDS,
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
    print_json,
    reproduce_command,
    results_dir,
    say_error,
)
from parlab.errors import UsageError
from parlab.runtime.launch import Nodes, default_timeout_s, on_nodes
from parlab.units import format_bytes, format_seconds

profile_app = typer.Typer(
    help="Profile runs on every rank: overlap, exposed communication, idle, hotspots, stragglers.",
    no_args_is_help=True,
)
app.add_typer(profile_app, name="profile")

ScheduleOption = typer.Option(
    "1,1,2", "--schedule", help="Profiler schedule wait,warmup,active (steps)."
)
TraceDirOption = typer.Option(
    None,
    "--trace-dir",
    help="Where the ranks write traces (default: <results>/profile-traces/<run>).",
)


def _outcome_row(o: Any) -> list[str]:
    s = o.summary
    ov = s.mean("overlap_pct")
    top = s.hotspots[0] if s.hotspots else None
    return [
        o.doc.workload.get("label") or "-",
        format_seconds(s.mean("step_time_s") or 0.0),
        format_seconds(s.mean("compute_s") or 0.0),
        format_seconds(s.mean("comm_s") or 0.0),
        "n/a" if ov is None else f"{ov:.1f}%",
        format_seconds(s.mean("exposed_s") or 0.0),
        format_seconds(s.mean("idle_s") or 0.0),
        f"{s.mean('comm_count'):.0f} / {format_bytes(s.mean('comm_bytes') or 0.0)}",
        _predicted(o.doc),
        f"{top.name} ({format_seconds(top.exposed_per_step_s)} exposed)" if top else "-",
    ]


def _predicted(doc: Any) -> str:
    p = doc.predictions
    if "comm_count_per_step" not in p or "comm_bytes_per_step" not in p:
        return "-"
    n, b = p["comm_count_per_step"].value, p["comm_bytes_per_step"].value
    return f"{n:.0f} / {format_bytes(b)}" if n is not None and b is not None else "-"


def print_outcomes(outcomes: list[Any]) -> None:
    level = outcomes[0].doc.evidence_level
    t = Table(title=f"parlab profile ({level}; per step, mean over ranks)", title_justify="left")
    for c in (
        "config",
        "step",
        "compute",
        "comm",
        "overlap",
        "exposed",
        "idle",
        "colls/bytes",
        "ledger says",
        "top hotspot",
    ):
        t.add_column(c)
    for o in outcomes:
        t.add_row(*_outcome_row(o))
    console.print(t)
    if len(outcomes) == 1:
        console.print(outcomes[0].text.rstrip(), markup=False)
    for o in outcomes:
        arts = ", ".join(str(p) for p in o.artifacts.values())
        console.print(f"{o.doc.workload.get('label')}: {o.path} ({arts})", markup=False)


@profile_app.command("analyze")
def analyze_cmd(
    trace_dir: Path = typer.Argument(..., help="Folder of per-rank traces (.json or .json.gz)."),
    results: Path | None = ResultsOption,
    project: str | None = typer.Option(
        None,
        help="Project of the profiled run (default: from the traces, else PAR-TRAINING-STATE).",
    ),
    label: str | None = typer.Option(None, help="Name of the profiled configuration."),
    timeline_step: int | None = typer.Option(
        None, help="Step the timeline PNG draws (default: the step of median length)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
) -> None:
    """Analyse a folder of per-rank Chrome traces (one per rank, any torch.profiler output)."""
    from parlab.profile.report import profile_folder
    from parlab.profile.trace_reader import TraceFormatError

    try:
        o = profile_folder(
            trace_dir,
            results=results_dir(results),
            command=reproduce_command(),
            project=project,
            label=label,
            timeline_step=timeline_step,
        )
    except TraceFormatError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print_json(o.doc.to_json())
        return
    print_outcomes([o])
    for p in o.run.problems:
        say_error(f"warning: {p.message}")


def _profile_env(
    trace_dir: Path, schedule: str, run_id: str, project: str | None
) -> dict[str, str]:
    from parlab.profile import capture

    env = dict(os.environ)
    env[capture.ENV_DIR] = str(trace_dir)
    env[capture.ENV_SCHEDULE] = schedule
    env[capture.ENV_RUN_ID] = run_id
    if project:
        env[capture.ENV_PROJECT] = project
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@profile_app.command(
    "run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def run_cmd(
    ctx: typer.Context,
    nproc: int = typer.Option(
        2, click_type=COUNT, help="Ranks on this node for a script (torchrun --nproc-per-node)."
    ),
    schedule: str = ScheduleOption,
    trace_dir: Path | None = TraceDirOption,
    results: Path | None = ResultsOption,
    project: str | None = typer.Option(None, help="Project of the profiled run."),
    timeout: float = typer.Option(
        1800.0, click_type=SECONDS, help="Wall-clock limit for the profiled command, seconds."
    ),
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """Profile a command: ``parlab profile run --nproc 2 -- train.py ARGS`` or ``-- parlab train ...``."""
    from parlab.contract import new_run_id
    from parlab.profile.capture import parse_schedule
    from parlab.profile.report import profile_folder

    cmd = list(ctx.args)
    if not cmd:
        raise UsageError(
            "nothing to profile: give a command after --, e.g. -- train.py or -- parlab train"
        )
    try:
        parse_schedule(schedule)
    except ValueError as exc:
        raise UsageError(f"--schedule: {exc}") from None
    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    root = results_dir(results)
    run_id = new_run_id("profile-run")
    tdir = trace_dir or root / "profile-traces" / run_id
    argv = _profiled_argv(cmd, nproc, job)
    tdir.mkdir(parents=True, exist_ok=True)
    say_error(f"profiling: {' '.join(argv)}  (traces -> {tdir})")
    try:
        rc = subprocess.run(
            argv, env=_profile_env(tdir, schedule, run_id, project), timeout=timeout
        ).returncode
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"the profiled command passed --timeout {timeout:.0f} s and was stopped"
        ) from None
    if rc != 0:
        say_error(f"the profiled command exited with status {rc}; analysing what it wrote")
    if not any(tdir.glob("*.json*")):
        # it ran, so this is not bad input (exit 2 means nothing was launched): exit 1
        say_error(
            f"parlab: error: the command wrote no trace in {tdir}: a parlab command must profile "
            "its loop with parlab.profile.capture.maybe_profile, and a script must run at least "
            f"wait+warmup+active optimizer steps ({schedule})"
        )
        raise typer.Exit(1)
    o = profile_folder(
        tdir, results=root, command=reproduce_command(), project=project, run_id=None
    )
    print_outcomes([o])
    if rc != 0:
        raise typer.Exit(1)


def _profiled_argv(cmd: list[str], nproc: int, job: Nodes) -> list[str]:
    """torchrun over a script, or a parlab command (which launches its own ranks: on several
    nodes it gets the launch flags)."""
    if cmd[0].endswith(".py"):
        if not Path(cmd[0]).is_file():
            raise UsageError(f"script {cmd[0]} does not exist: give the path of a torchrun script")
        argv = [sys.executable, "-m", "torch.distributed.run", *job.torchrun_args()]
        argv += ["--nproc-per-node", str(nproc), "--max-restarts", "0"]
        return [*argv, "-m", "parlab.profile.runner", *cmd]
    if cmd[0] == "parlab":
        flags: list[str] = []
        if job.multi:
            flags = ["--nnodes", str(job.nnodes), "--node-rank", str(job.node_rank)]
            flags += ["--rdzv-endpoint", str(job.rdzv_endpoint), "--rdzv-backend"]
            flags += [job.rdzv_backend, "--rdzv-id", job.rdzv_id]
        return [sys.executable, "-m", "parlab", *cmd[1:], *flags]
    raise UsageError(
        f"cannot profile {cmd[0]!r}: give a torchrun script (script.py ARGS) or a parlab command"
    )


# ---------------------------------------------------------------------------
# presets


def run_preset(
    preset: str, kwargs: dict[str, Any], *, job: Nodes, quiet: bool = False, **opts: Any
) -> list[Any]:
    """Run a preset sweep (``parlab.profile.sweep``) on the job's nodes, print it, exit 1 if the
    run failed."""
    from parlab.profile.sweep import run_sweep

    if opts.get("timeout") is None:
        opts["timeout"] = default_timeout_s(opts.get("nproc") or 1, opts.get("backend", "auto"))
    if opts.get("nproc") is not None:
        opts["nproc"] *= job.nnodes
    elif job.multi:
        raise UsageError("on several nodes give --nproc (ranks on each node)")
    with on_nodes(job):
        res = run_sweep(preset, kwargs, **opts)
    if res.failure is not None:
        f = res.failure
        say_error(f"profile preset {preset} failed ({f.kind}, rank {f.rank}): {f.message}")
        say_error(f"wrote {res.failure_path} (failure document)")
        raise typer.Exit(1)
    if res.sweep_png is not None:
        say_error(f"sweep plot: {res.sweep_png}")
    if not quiet:
        print_outcomes(res.outcomes)
    return res.outcomes


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
    from parlab.models import get_spec

    spec = get_spec(model)
    if batch < 1 or seq < 2:
        raise UsageError(f"--micro-batch {batch} / --seq {seq}: need micro-batch >= 1, seq >= 2")
    if seq > spec.max_seq_len:
        raise UsageError(f"--seq {seq} is longer than {model}'s max_seq_len {spec.max_seq_len}")


ModelOption = typer.Option("tiny", help="Reference model spec (tiny, small, 1.3b, ...).")
BatchOption = typer.Option(
    2, "--micro-batch", click_type=COUNT, help="Sequences per rank per micro-batch."
)
SeqOption = typer.Option(64, click_type=COUNT, help="Sequence length.")
NprocOption = typer.Option(
    None, click_type=COUNT, help="Ranks on this node (default: every GPU, or 2 on CPU)."
)
BackendOption = typer.Option(
    "auto", click_type=Choice(("auto", "nccl", "gloo")), help="auto: NCCL on GPUs, else gloo."
)


@profile_app.command("ddp-buckets")
def ddp_buckets_cmd(
    buckets: str = typer.Option("1,5,25", help="bucket_cap_mb values, comma-separated."),
    model: str = ModelOption,
    batch: int = BatchOption,
    seq: int = SeqOption,
    nproc: int | None = NprocOption,
    backend: str = BackendOption,
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
        {"model": model, "batch": batch, "seq": seq, "buckets_mb": _floats(buckets, "--buckets")},
        nproc=nproc,
        backend=backend,
        timeout=timeout,
        job=nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id),
        results=results_dir(results),
        trace_dir=trace_dir,
        schedule=schedule,
        project="PAR-TRAINING-STATE",
        command=reproduce_command(),
        plot=("DDP: exposed communication vs bucket_cap_mb", "bucket_cap_mb"),
    )


@profile_app.command("ddp")
def ddp_cmd(
    bucket_mb: float = typer.Option(25.0, click_type=POSITIVE, help="DDP bucket_cap_mb."),
    model: str = ModelOption,
    batch: int = BatchOption,
    seq: int = SeqOption,
    nproc: int | None = NprocOption,
    backend: str = BackendOption,
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
        {
            "model": model,
            "batch": batch,
            "seq": seq,
            "buckets_mb": _floats(str(bucket_mb), "--bucket-mb"),
        },
        nproc=nproc,
        backend=backend,
        timeout=timeout,
        job=nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id),
        results=results_dir(results),
        trace_dir=trace_dir,
        schedule=schedule,
        project="PAR-TRAINING-STATE",
        command=reproduce_command(),
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
    batch: int = BatchOption,
    seq: int = SeqOption,
    nproc: int | None = NprocOption,
    backend: str = BackendOption,
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
        {"model": model, "batch": batch, "seq": seq, "configs": [FSDP_CONFIGS[c] for c in names]},
        nproc=nproc,
        backend=backend,
        timeout=timeout,
        job=nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id),
        results=results_dir(results),
        trace_dir=trace_dir,
        schedule=schedule,
        project="PAR-TRAINING-STATE",
        command=reproduce_command(),
        plot=("FSDP2: prefetch and reshard_after_forward", "setting"),
    )


@profile_app.command("tp")
def tp_cmd(
    model: str = ModelOption,
    batch: int = BatchOption,
    seq: int = SeqOption,
    nproc: int | None = NprocOption,
    backend: str = BackendOption,
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
    from parlab.profile.sweep import default_nproc

    n = nproc or default_nproc()
    if seq % (n * nnodes):
        raise UsageError(
            f"--seq {seq} must divide by the {n * nnodes} TP ranks for sequence parallelism"
        )
    run_preset(
        "tp",
        {"model": model, "batch": batch, "seq": seq, "sequence_parallel": [False, True]},
        nproc=n,
        backend=backend,
        timeout=timeout,
        job=nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id),
        results=results_dir(results),
        trace_dir=trace_dir,
        schedule=schedule,
        project="PAR-MODEL-INTERNAL",
        command=reproduce_command(),
        plot=("TP: without and with sequence parallelism", "setting"),
    )


def demo_step(results: Path, console_: Any) -> None:
    """``parlab demo``: a CPU-sized DDP bucket sweep on 2 gloo ranks, profiled and analysed."""
    from parlab.profile.sweep import run_sweep

    res = run_sweep(
        "ddp-buckets",
        {"model": "tiny", "batch": 2, "seq": 64, "buckets_mb": [0.01, 1.0]},
        nproc=2,
        backend="gloo",
        timeout=60.0,
        results=results,
        trace_dir=None,
        schedule="1,1,2",
        project="PAR-TRAINING-STATE",
        command="parlab profile ddp-buckets --buckets 0.01,1 --model tiny --seq 64 "
        f"--backend gloo --nproc 2 --results {results}",
        plot=("DDP: exposed communication vs bucket_cap_mb", "bucket_cap_mb"),
    )
    if res.failure is not None:
        raise RuntimeError(f"profile preset failed ({res.failure.kind}): {res.failure.message}")
    print_outcomes(res.outcomes)
