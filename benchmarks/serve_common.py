"""Shared helpers of the serving benchmarks: environment header, child servers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


def header(title: str) -> None:
    import torch

    print(f"# {title}")
    print(
        f"# python {platform.python_version()}, torch {torch.__version__}, "
        f"CPU cores {os.cpu_count()}, GPUs {torch.cuda.device_count()}, "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    if not torch.cuda.is_available():
        print("# note: on the development machine the 2 cores were shared with other work")


def spawn(args: list[str], marker: str = "listening on ") -> tuple[subprocess.Popen, str]:
    """Start ``python -m parlab <args>`` and return it with the URL it prints."""
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    p = subprocess.Popen(
        [sys.executable, "-m", "parlab", *args], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if marker in line:
            return p, line.strip().split(marker)[1]
        if not line and p.poll() is not None:
            break
    p.kill()
    raise RuntimeError(f"{args} did not start")
