"""MoE expert-parallel dispatch + combine against a plain all_to_all at the same payload.

What is measured: for each tokens-per-rank size and each routing workload
(uniform, Zipf), ``parlab.projects.moe.rank.moe_rank`` runs the expert-parallel
layer (all-to-all) and the naive one (all-gather + reduce-scatter) on
``--ep`` ranks launched through torchrun (NCCL on GPUs, gloo on CPU).

How it is timed: every phase of a forward is bracketed by a barrier of the
ep group and a device synchronisation; the median of ``--iters`` forwards
after ``--warmup`` is kept, and a collective's time is the slowest rank's.
busbw follows nccl-tests for all-to-all: S / t x (n-1)/n with S the mean
per-rank send buffer. The reference is a plain equal-split
``all_to_all_single`` at the same mean payload, timed the same way in the
same process.

Target (issue 7, on 2xH200 with bf16, hidden 4096): dispatch + combine
busbw at least 85% of the reference. On the CPU (gloo) the numbers only
show the mechanism runs; they are not speeds to compare.

    .venv/bin/python benchmarks/moe_dispatch.py [--ep 2] [--tokens 256,1024,4096] [--hidden 256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from parlab.hardware.env import software
from parlab.projects.moe import MoERunConfig
from parlab.runtime.launch import LaunchConfig, launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=None, help="default 4096 on GPUs, 256 on CPU")
    ap.add_argument("--ffn-hidden", type=int, default=None)
    ap.add_argument("--tokens", default=None, help="comma-separated tokens per rank")
    ap.add_argument("--skew", type=float, default=1.2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= a.ep
    hidden = a.hidden or (4096 if gpu else 256)
    ffn = a.ffn_hidden or (2048 if gpu else 512)
    tokens = [
        int(t) for t in (a.tokens or ("4096,16384,32768" if gpu else "256,1024,4096")).split(",")
    ]
    sw = software()
    devices = torch.cuda.get_device_name(0) + f" x {a.ep}" if gpu else f"CPU, {a.ep} gloo ranks"
    print(f"torch {sw['torch']}  CUDA {sw['cuda'] or '-'}  NCCL {sw['nccl'] or '-'}  on {devices}")
    print(
        f"ep {a.ep}, {a.experts} experts, top-{a.topk}, hidden {hidden}, expert FFN {ffn}, dropless"
    )
    head = f"{'tokens/rank':>11} {'workload':>9} {'payload':>10} {'dispatch':>10} {'combine':>10} "
    head += f"{'a2a busbw':>10} {'plain a2a':>10} {'ratio':>6} {'slowest+':>8} {'naive/a2a':>9}"
    print(head)
    try:
        for t in tokens:
            cfg = MoERunConfig(
                ep=a.ep, experts=a.experts, topk=a.topk, capacity_factor=None, drop="none",
                hidden=hidden, ffn_hidden=ffn, tokens=t, skews=(a.skew,), sweep=(1.0,),
                train_steps=0, warmup=a.warmup, iters=a.iters,
            )  # fmt: skip
            res = launch(
                "parlab.projects.moe.rank:moe_rank", cfg.to_json(), LaunchConfig(nproc=a.ep)
            )
            if not res.ok:
                print(f"{t:>11} failed: {res.failure}")
                continue
            _rows(t, res.results, a.ep)
    except KeyboardInterrupt:
        print("interrupted: the rows above were measured")


def _rows(tokens: int, ranks: list[dict], n: int) -> None:
    for i, w in enumerate(ranks[0]["workloads"]):
        ws = [r["workloads"][i] for r in ranks]
        d_b = sum(x["bytes"]["dispatch"] for x in ws) / n
        c_b = sum(x["bytes"]["combine"] for x in ws) / n
        d_t = max(x["phases"]["dispatch"] for x in ws)
        c_t = max(x["phases"]["combine"] for x in ws)
        bw = (d_b + c_b) / (d_t + c_t) * (n - 1) / n / 1e9 if n > 1 else float("nan")
        ref = w["reference_a2a"]
        ref_bw = ref["bytes"] / ref["seconds"] * (n - 1) / n / 1e9 if n > 1 else float("nan")
        comp = [x["phases"]["experts"] for x in ws]
        excess = 100 * (max(comp) / (sum(comp) / n) - 1)
        layer = sum(max(x["phases"][p] for x in ws) for p in w["phases"])
        naive = sum(max(x["naive_phases"][p] for x in ws) for p in w["naive_phases"])
        print(
            f"{tokens:>11} {w['name']:>9} {d_b / 2**20:>8.2f}Mi {d_t * 1e3:>8.3f}ms {c_t * 1e3:>8.3f}ms "
            f"{bw:>6.2f}GB/s {ref_bw:>6.2f}GB/s {bw / ref_bw:>6.0%} {excess:>7.1f}% {naive / layer:>9.2f}"
        )


if __name__ == "__main__":
    main()
