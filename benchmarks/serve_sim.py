"""Simulator scale: 1,000 replicas and 1M requests on one core, per routing policy.

Method: ``parlab.serve.sim.simulate`` on a shared-prefix workload held as
arrays (Poisson arrivals at ``--rate``, ``--groups`` system prompts of
``--prefix-len`` tokens, 64 unique tokens, 128 output tokens), prefix blocks
of 64 tokens, with illustrative iteration times (a replica profile is an
input; here it is fixed so the runs are comparable). Wall time is
``time.perf_counter`` around the call, in this one process (one core).
The simulated metrics are printed beside it.

    python benchmarks/serve_sim.py [--replicas 1000] [--requests 1000000]
"""

from __future__ import annotations

import argparse
import time

import serve_common

from parlab.serve import sim
from parlab.serve.policy import PolicyConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--groups", type=int, default=4000)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--policies", default="round_robin,least_outstanding,power_of_two,cache_aware")
    a = ap.parse_args()
    serve_common.header(
        f"simulator: {a.replicas} replicas, {a.requests} requests, {a.rate:g} req/s, one core"
    )
    prof = sim.ReplicaProfile(
        prefill_base_s=2e-3,
        prefill_per_token_s=2e-5,
        decode_base_s=8e-3,
        decode_per_seq_s=2e-4,
        max_batch=64,
        block=64,
        cache_blocks=512,
    )
    w = sim.shared_prefix_arrays(
        n=a.requests,
        groups=a.groups,
        prefix_len=a.prefix_len,
        question_len=64,
        output_len=128,
        rate=a.rate,
    )
    print(
        f"{'policy':>18} {'wall s':>7} {'events':>9} {'req/s':>8} {'cache hit':>9} "
        f"{'TTFT mean':>9} {'TTFT p99':>9} {'TPOT mean':>9} {'TPOT p99':>9} {'imbalance':>9}"
    )
    try:
        for name in a.policies.split(","):
            t0 = time.perf_counter()
            r = sim.simulate(w, replicas=a.replicas, profile=prof, policy=PolicyConfig(name=name))
            wall = time.perf_counter() - t0
            print(
                f"{name:>18} {wall:7.1f} {r['events']:9d} {r['request_throughput']:8.0f} "
                f"{r['cache_hit_rate']:9.1%} {r['mean_ttft_ms']:9.1f} {r['p99_ttft_ms']:9.1f} "
                f"{r['mean_tpot_ms']:9.2f} {r['p99_tpot_ms']:9.2f} {r['load_imbalance']:9.3f}",
                flush=True,
            )
    except KeyboardInterrupt:
        print("interrupted: rows above are what was measured")


if __name__ == "__main__":
    main()
