"""``parlab profile``: per-rank traces -> overlap, exposed communication, idle, hotspots, stragglers.

This module: ``analyze`` and ``run``; the presets are in ``parlab.cli.profile_presets``.

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
    SECONDS,
    JsonDocument,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    console,
    nodes,
    print_json,
    reproduce_command,
    results_dir,
    say_error,
)
from parlab.contract import new_run_id
from parlab.errors import UsageError
from parlab.profile.trace_reader import TraceFormatError
from parlab.runtime.launch import Nodes
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
    as_json: JsonDocument = False,
) -> None:
    """Analyse a folder of per-rank Chrome traces (one per rank, any torch.profiler output)."""
    from parlab.profile.report import profile_folder  # lazy: numpy

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
    from parlab.profile import capture  # lazy: torch

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
    from parlab.profile.capture import parse_schedule  # lazy: torch
    from parlab.profile.report import profile_folder  # lazy: numpy

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


def demo_step(results: Path, console_: Any) -> None:
    """``parlab demo``: a CPU-sized DDP bucket sweep on 2 gloo ranks, profiled and analysed."""
    from parlab.profile.sweep import run_sweep  # lazy: torch

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
