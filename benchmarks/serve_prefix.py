"""Cache-aware routing against round-robin on a shared-prefix workload, with real replicas.

Method: ``parlab.projects.serving.run_project`` at CPU size -- two reference
replicas (``tiny`` model, one thread each, prefix cache of 128 blocks of 16
tokens, too small for every group on every replica), the router in this
process, the same seeded shared-prefix workload (8 groups, 384-token system
prompts, 32-token questions, 16 output tokens, Poisson arrivals) once per
policy. The cache-hit rate is the servers' own count
(``usage.prompt_tokens_details.cached_tokens``); TTFT and TPOT are the
client's (vLLM definitions). The table also shows the simulator's
predictions from the replica's idle profile ("sim") and from the iteration
costs the replicas showed while serving the first policy's run ("fit": in
sample for that first run, out of sample for the others). Documents go to ``--results``.

    python benchmarks/serve_prefix.py [--results DIR] [--num-prompts 64] [--rate 6]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import serve_common
from rich.console import Console

from parlab.contract import read_results
from parlab.projects.serving import run_project


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--policies", default="round_robin,least_outstanding,cache_aware")
    a = ap.parse_args()
    serve_common.header("prefix-aware routing vs round-robin, 2 tiny replicas on CPU")
    root = a.results or Path(tempfile.mkdtemp(prefix="parlab-prefix-"))
    run_project(
        root,
        preset="cpu",
        policies=a.policies.split(","),
        num_prompts=a.num_prompts,
        request_rate=a.rate,
        kv_transfer=False,
        console=Console(width=200),
        command=f"python benchmarks/serve_prefix.py --num-prompts {a.num_prompts} --rate {a.rate}",
    )
    entries, _ = read_results(root)
    docs = {
        e.doc.layout.get("policy"): e.doc
        for e in entries
        if e.doc.evidence_level == "serving-benchmark" and e.doc.layout.get("policy")
    }

    def g(d, k):
        v = d.metric(k)
        return float("nan") if v is None else v

    def p(d, k):
        x = d.predictions.get(k)
        return float("nan") if x is None or x.value is None else x.value

    print(
        f"{'policy':>18} {'ok':>4} {'hit':>6} {'TTFT mean':>9} {'TTFT p99':>9} {'TPOT mean':>9} "
        f"{'sim TTFT':>8} {'sim TPOT':>8} {'fit TTFT':>9} {'fit TPOT':>9}  (ms)"
    )
    for name, d in docs.items():
        print(
            f"{name:>18} {g(d, 'completed'):4.0f} {g(d, 'cache_hit_rate'):6.1%} "
            f"{g(d, 'mean_ttft_ms'):9.1f} {g(d, 'p99_ttft_ms'):9.1f} {g(d, 'mean_tpot_ms'):9.2f} "
            f"{p(d, 'mean_ttft_ms'):8.1f} {p(d, 'mean_tpot_ms'):8.2f} "
            f"{p(d, 'mean_ttft_ms@in_run'):9.1f} {p(d, 'mean_tpot_ms@in_run'):9.2f}"
        )
    if "round_robin" in docs and "cache_aware" in docs:
        rr, ca = docs["round_robin"], docs["cache_aware"]
        print(
            f"cache_aware / round_robin: cache-hit rate x{g(ca, 'cache_hit_rate') / g(rr, 'cache_hit_rate'):.2f}, "
            f"mean TTFT x{g(ca, 'mean_ttft_ms') / g(rr, 'mean_ttft_ms'):.2f}, "
            f"p99 TTFT x{g(ca, 'p99_ttft_ms') / g(rr, 'p99_ttft_ms'):.2f}"
        )
    print(f"# documents: {root}")


if __name__ == "__main__":
    main()
