"""``parlab launch --slurm``: an sbatch script that runs a parlab command on several nodes.

The script asks Slurm for N nodes with one task each; ``srun`` starts one parlab
launcher per node (which starts torchrun, which starts that node's ranks), each with
torchrun's multi-node flags: ``--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID``, the
allocation's first node as ``--rdzv-endpoint`` (c10d rendezvous) and the job id as
``--rdzv-id``. It exports the NCCL_* (and gloo, NVSHMEM, torch NCCL) variables set where
it was written, and any ``--env KEY=VALUE``. Every node writes its own document.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import typer

from parlab.cli import app
from parlab.cli.common import COUNT, PORT, reproduce_command, say_error
from parlab.contract import atomic_write_text
from parlab.errors import UsageError

DISTRIBUTED = (
    ("train",),
    ("collectives",),
    ("env",),
    ("project", "training-state"),
    ("project", "moe"),
    ("profile", "ddp"),
    ("profile", "ddp-buckets"),
    ("profile", "fsdp"),
    ("profile", "tp"),
)
"""The commands that take torchrun's launch flags."""
LAUNCH_FLAGS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id")
EXPORTED = ("NCCL_", "TORCH_NCCL_", "GLOO_", "NVSHMEM_", "TORCH_SYMM_MEM_", "TORCH_DISTRIBUTED_")
"""Prefixes of the variables the script exports from the environment it is written in."""
_SLURM_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


def _command(argv: list[str], gpus_per_node: int) -> list[str]:
    """The user's parlab command, checked, with ``--nproc`` set to the GPUs of a node."""
    if not argv or argv[0] != "parlab":
        raise UsageError("give the parlab command to run after --, e.g. -- parlab train ...")
    words = tuple(a for a in argv[1:3] if not a.startswith("-"))
    if not any(words[: len(d)] == d for d in DISTRIBUTED):
        names = ", ".join(" ".join(d) for d in DISTRIBUTED)
        raise UsageError(f"parlab {' '.join(words)} does not launch ranks: give one of {names}")
    given = [f for f in LAUNCH_FLAGS if any(a == f or a.startswith(f + "=") for a in argv)]
    if given:
        raise UsageError(f"leave {', '.join(given)} out: the script sets them on each node")
    cmd = list(argv)
    if words[:2] != ("project", "moe") and not any(
        a == "--nproc" or a.startswith("--nproc=") for a in argv
    ):
        cmd += ["--nproc", str(gpus_per_node)]
    return cmd


def sbatch_script(
    argv: list[str],
    *,
    nodes: int,
    gpus_per_node: int,
    port: int = 29500,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str | None = None,
    job_name: str = "parlab",
    env: dict[str, str] | None = None,
    written_by: str = "",
) -> str:
    """The sbatch script (see the module docstring)."""
    cmd = _command(argv, gpus_per_node)
    if time_limit is not None and not _SLURM_TIME.match(time_limit):
        raise UsageError(f"--time {time_limit!r}: write Slurm's [DAYS-]HH:MM:SS, e.g. 01:00:00")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", job_name):
        raise UsageError(f"--job-name {job_name!r}: use letters, digits, '.', '_', '-'")
    variables = {k: v for k, v in sorted(os.environ.items()) if k.startswith(EXPORTED)}
    variables.update(env or {})
    head = [
        "#!/bin/bash",
        f"# written by: {written_by}" if written_by else "# written by parlab launch --slurm",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
    ]
    head += [f"#SBATCH --partition={partition}"] if partition else []
    head += [f"#SBATCH --account={account}"] if account else []
    head += [f"#SBATCH --time={time_limit}"] if time_limit else []
    body = [
        "set -euo pipefail",
        "# the rendezvous: the allocation's first node",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        "head_node=${nodes[0]}",
        f'export PARLAB_RDZV_ENDPOINT="$head_node:{port}"',
        *(f"export {k}={shlex.quote(v)}" for k, v in variables.items()),
        "# one parlab launcher per node; each starts torchrun, which starts the node's ranks",
    ]
    launch_flags = (
        ' --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --rdzv-backend c10d'
        ' --rdzv-endpoint "$PARLAB_RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID"'
    )
    inner = "exec " + shlex.join(cmd) + launch_flags
    body.append(
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}"
    )
    return "\n".join([*head, "", *body]) + "\n"


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env {item!r}: write KEY=VALUE")
        out[key] = value
    return out


@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch_cmd(
    ctx: typer.Context,
    slurm: bool = typer.Option(False, "--slurm", help="Write a Slurm sbatch script."),
    nodes: int = typer.Option(2, "--nodes", click_type=COUNT, help="Nodes to allocate."),
    gpus_per_node: int = typer.Option(
        8, "--gpus-per-node", click_type=COUNT, help="GPUs per node (each node's --nproc)."
    ),
    port: int = typer.Option(29500, "--port", click_type=PORT, help="Rendezvous port."),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition."),
    account: str | None = typer.Option(None, "--account", help="Slurm account."),
    time_limit: str | None = typer.Option(None, "--time", help="Slurm time limit, HH:MM:SS."),
    job_name: str = typer.Option("parlab", "--job-name", help="Slurm job name."),
    env: list[str] | None = typer.Option(
        None, "--env", help="KEY=VALUE to export on every node (repeat)."
    ),
    out: Path = typer.Option(Path("parlab.sbatch"), "--out", help="Where to write the script."),
) -> None:
    """Write a job script that runs a distributed parlab command on several nodes."""
    if not slurm:
        raise UsageError("parlab launch writes a job script: give --slurm (the scheduler)")
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder: give a file name, e.g. {out / 'job.sbatch'}")
    text = sbatch_script(
        list(ctx.args), nodes=nodes, gpus_per_node=gpus_per_node, port=port,
        partition=partition, account=account, time_limit=time_limit, job_name=job_name,
        env=_env_pairs(env), written_by=reproduce_command(),
    )  # fmt: skip
    atomic_write_text(out, text)
    out.chmod(0o755)
    say_error(f"wrote {out}: submit it with sbatch {out}")
