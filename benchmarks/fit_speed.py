"""How fast ``fit`` searches every candidate layout up to 1,024 GPUs (target: < 1 s on one core).

What is measured: ``parlab.ledger.fit.fit_all`` -- for every world size 1, 2,
4, ..., 1024, every layout ``parlab fit`` considers (tp within a node and
dividing the heads, pp dividing the layers, cp for long sequences, ep for MoE,
six data-parallel strategies), the full per-rank ledger (``predict``) and the
wire table (``traffic``) -- for a catalog model on H100s.

How it is timed: wall time (``time.perf_counter``) of one whole search in a
single process pinned to one thread, "cold" with every cache cleared first
(what one ``parlab fit`` invocation pays) and "warm" (the caches of a previous
search kept), best of ``--repeat`` runs. Nothing is launched; no torch.

Run: ``.venv/bin/python benchmarks/fit_speed.py [--model llama3.1-405b] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from parlab.hardware.catalog import require
from parlab.ledger import sharding, stages
from parlab.ledger.fit import fit_all
from parlab.models import get_spec

TARGET_S = 1.0
TARGET_MODEL = "llama3.1-405b"
"""The issue's target: fit for a 405B model over every layout up to 1,024 GPUs in < 1 s."""


def clear_caches() -> None:
    sharding.holding.cache_clear()
    sharding.unit_dim0_numel.cache_clear()
    stages.stage_numbers.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="catalog model (repeatable)")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    models = args.model or ["llama3.1-405b", "deepseek-v3", "llama3.1-70b", "mixtral-8x7b"]
    gpu = require(args.gpu)
    print(f"python {platform.python_version()} on {platform.machine()}, one core; "
          f"{gpu.name}, world sizes 1..{args.max_gpus} (powers of two), seq {args.seq}")  # fmt: skip
    header = (
        f"{'model':<16}{'layouts':>9}{'fit':>7}{'cold s':>9}{'warm s':>9}{'us/layout':>11}  target"
    )
    print(header)
    print("-" * len(header))
    try:
        for name in models:
            spec = get_spec(name)
            cold, warm = [], []
            rows: list = []
            for _ in range(args.repeat):
                clear_caches()
                t0 = time.perf_counter()
                rows = fit_all(spec, gpu=gpu, max_gpus=args.max_gpus, seq_len=args.seq)
                cold.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                fit_all(spec, gpu=gpu, max_gpus=args.max_gpus, seq_len=args.seq)
                warm.append(time.perf_counter() - t0)
            c, w = min(cold), min(warm)
            ok = ("ok" if c < TARGET_S else "MISSED") if name == TARGET_MODEL else "(no target)"
            print(f"{name:<16}{len(rows):>9}{sum(f for *_, f in rows):>7}{c:>9.3f}{w:>9.3f}"
                  f"{1e6 * c / max(1, len(rows)):>11.0f}  < {TARGET_S:.0f} s {ok}")  # fmt: skip
    except KeyboardInterrupt:
        print("interrupted: rows above are complete")


if __name__ == "__main__":
    main()
