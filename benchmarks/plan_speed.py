"""How long ``parlab plan``'s full search takes on one core.

Target (issue 10): Llama-3.1 405B on 1,024 H100s (8 per node), global batch
2,048 sequences of 8,192 tokens, the whole default space (every dp/tp/pp/cp,
ddp/zero1/zero2/zero3/fsdp, micro-batch 1/2/4/8, three recompute modes, three
pipeline schedules), in under 5 s on one core.

Method: ``parlab.plan.planner.plan`` is timed with ``time.perf_counter``
around the whole call (constraint table, ledger, wire table, estimates,
ranking, Pareto), once per case after one untimed warm-up search of a small
case (imports, caches); the process is pinned to one core where the OS allows
(``os.sched_setaffinity``) and torch is never imported. The table also gives
the number of candidates, how many reached the ledger, and the time per
ledger call, because the ledger's per-call cost dominates the search.

Run: ``.venv/bin/python benchmarks/plan_speed.py``
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CASES = (
    ("1.3b", "8xH100", 8, 64, 4096),
    ("llama3.1-8b", "64xH100", 8, 512, 8192),
    ("llama3.1-70b", "256xH100", 8, 1024, 8192),
    ("llama3.1-405b", "1024xH100", 8, 2048, 8192),
)
TARGET_S = 5.0


def main() -> None:
    from parlab.models import get_spec
    from parlab.plan.estimate import assumed_throughput
    from parlab.plan.planner import DEFAULT_MFU, PlanRequest, plan
    from parlab.plan.space import make_cluster

    pinned = "no"
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        pinned = f"cpu {cpu}"
    print(
        f"python {platform.python_version()} on {platform.machine()}, pinned to one core: {pinned}"
    )

    def request(model: str, gpus: str, per_node: int, gb: int, seq: int) -> PlanRequest:
        cluster = make_cluster(gpus=gpus, gpus_per_node=per_node)
        th = assumed_throughput(DEFAULT_MFU, cluster.gpu.peak("bf16"), cluster.gpu.name)
        return PlanRequest(
            spec=get_spec(model), cluster=cluster, global_batch=gb, seq=seq, throughput=th
        )

    plan(request("tiny", "2xH100", 2, 8, 64))  # warm-up
    head = (
        f"{'model':<15}{'GPUs':>11}{'candidates':>12}{'admitted':>10}{'ledger calls':>14}"
        f"{'ms/call':>9}{'search s':>10}  target"
    )
    print(head)
    print("-" * len(head))
    try:
        for model, gpus, per_node, gb, seq in CASES:
            req = request(model, gpus, per_node, gb, seq)
            t0 = time.perf_counter()
            res = plan(req)
            dt = time.perf_counter() - t0
            n = len(res.ranked) + len(res.rejected)
            per_call = 1e3 * dt / max(1, res.ledger_calls)
            verdict = ""
            if model == "llama3.1-405b":
                verdict = f"{'PASS' if dt < TARGET_S else 'FAIL'} (< {TARGET_S:g} s)"
            print(
                f"{model:<15}{gpus:>11}{n:>12,}{len(res.ranked):>10,}{res.ledger_calls:>14,}"
                f"{per_call:>9.2f}{dt:>10.2f}  {verdict}"
            )
    except KeyboardInterrupt:
        print("interrupted: the rows above were measured")


if __name__ == "__main__":
    main()
