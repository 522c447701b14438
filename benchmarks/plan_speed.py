"""How long ``parlab plan``'s full search takes on one core, the whole process included.

Target (issue 24): Llama-3.1 405B on 16,384 H100s (8 per node), global batch 2,048 sequences
of 8,192 tokens, the whole default space, under 5 s on one core from the command line to the
written document (start-up, imports, search, answers, document, candidate table and plot).

Method: each case runs ``python -m parlab plan ...`` as a fresh process pinned to one core
(``os.sched_setaffinity`` in the child, where the OS allows), timed by the parent with
``time.perf_counter`` around the whole process; the search's own time is what the plan prints.
Median of three runs per case.

Run: ``.venv/bin/python benchmarks/plan_speed.py``
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

CASES = (
    ("1.3b", "8xH100", 64, 4096),
    ("llama3.1-70b", "1024xH100", 1024, 8192),
    ("llama3.1-405b", "16384xH100", 2048, 8192),
    ("deepseek-v3", "2048xH100", 4096, 4096),
)
TARGET_S = 5.0
REPEATS = 3


def one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run(model: str, gpus: str, gb: int, seq: int, out: str) -> tuple[float, float, int]:
    """(whole process seconds, search seconds, candidates) of one plan."""
    args = [sys.executable, "-m", "parlab", "plan", "--model", model, "--gpus", gpus,
            "--global-batch", str(gb), "--seq", str(seq), "--results", out]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, preexec_fn=one_core, check=False)
    wall = time.perf_counter() - t0
    m = re.search(r"searched (\d+) candidates in ([\d.]+) s", done.stdout)
    if m is None:
        raise SystemExit(f"{model} on {gpus} failed: {done.stderr.strip() or done.stdout[-400:]}")
    return wall, float(m.group(2)), int(m.group(1))


def main() -> None:
    print(f"python {platform.python_version()}, {platform.machine()}, one core per process")
    print(f"{'model':<16}{'GPUs':>12}{'candidates':>12}{'search s':>10}{'process s':>11}  target")
    try:
        with tempfile.TemporaryDirectory() as out:
            for model, gpus, gb, seq in CASES:
                runs = [run(model, gpus, gb, seq, out) for _ in range(REPEATS)]
                wall = statistics.median(r[0] for r in runs)
                search = statistics.median(r[1] for r in runs)
                ok = "yes" if wall < TARGET_S else "NO"
                print(f"{model:<16}{gpus:>12}{runs[0][2]:>12,}{search:>10.2f}{wall:>11.2f}  "
                      f"< {TARGET_S:g} s: {ok}")  # fmt: skip
    except KeyboardInterrupt:
        print("interrupted: the rows above were measured")


if __name__ == "__main__":
    main()
