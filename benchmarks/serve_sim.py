"""Simulator scale: 1,000 replicas and 1M requests on one core, per routing policy.

Method: ``parlab.serve.sim.simulate`` on a shared-prefix workload held as
arrays (Poisson arrivals at ``--rate``, ``--groups`` system prompts of
``--prefix-len`` tokens, 64 unique tokens, 128 output tokens), prefix blocks
of 64 tokens, with illustrative iteration times (a replica profile is an
input; here it is fixed so the runs are comparable). Wall time is
``time.perf_counter`` around the call, in this one process (one core).
The simulated metrics are printed beside it.

``--graph-decode-len N`` prices decode iterations as an engine with CUDA-graph decode and
``max_len`` N does (``ReplicaProfile.decode_bucket_s``, at the key-length buckets of
``parlab.serve.engine.decode_buckets(N)``, illustrative seconds ``20.8 ms + 2 us * L``): the
simulator then also follows each replica's longest running request and ends a decode leap
where it reaches the next bucket.

    python benchmarks/serve_sim.py [--replicas 1000] [--requests 1000000] [--graph-decode-len N]

``benchmarks/results/serve_sim.txt`` holds the output of the plain run followed by that of
``--graph-decode-len 2048``.
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
    ap.add_argument(
        "--graph-decode-len",
        type=int,
        default=0,
        help="price decode per key-length bucket of a graph-decoding engine of this max_len "
        "(0: the linear decode cost)",
    )
    a = ap.parse_args()
    buckets = None
    if a.graph_decode_len:
        from parlab.serve.engine import decode_buckets

        buckets = tuple((L, 20.8e-3 + 2e-6 * L) for L in decode_buckets(a.graph_decode_len))
    serve_common.header(
        f"simulator: {a.replicas} replicas, {a.requests} requests, {a.rate:g} req/s, one core"
        + (f"; decode per graph bucket {[L for L, _ in buckets]}" if buckets else "")
    )
    prof = sim.ReplicaProfile(
        prefill_base_s=2e-3,
        prefill_per_token_s=2e-5,
        decode_base_s=8e-3,
        decode_per_seq_s=2e-4,
        max_batch=64,
        block=64,
        cache_blocks=512,
        decode_bucket_s=buckets,
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
