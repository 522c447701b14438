"""Benchmarks are scripts: the tests run them as a user does, and read what they print or write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _command(name: str, args: tuple[str, ...], nproc: int | None) -> list[str]:
    launcher = [sys.executable]
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [*launcher, str(ROOT / "benchmarks" / name), *args]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def start_script(name: str, *args: str, nproc: int | None = None) -> subprocess.Popen[str]:
    """``python benchmarks/<name> ARGS`` (``nproc``: under ``torchrun --standalone``) started
    from the repository root, stdout and stderr together."""
    return subprocess.Popen(
        _command(name, args, nproc),
        cwd=ROOT,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def run_script(
    name: str, *args: str, nproc: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The same, run to its end: its exit status and output, stdout and stderr apart."""
    return subprocess.run(
        _command(name, args, nproc),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
