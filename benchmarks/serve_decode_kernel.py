"""The engine's paged decode-attention kernel (``parlab.serve.engine.kernels.paged_decode``)
over its configurations: which one reads the KV cache nearest the copy bandwidth.

What it measures, on one CUDA GPU (bf16, the engine's cache layout ``[pages, page, K, D]``,
each sequence's pages a random permutation of the pool, random data):

- **copy bandwidth**: a 2 GiB device-to-device copy, bytes read plus written over the median
  of 10 copies;
- for each ``--batch`` B (every sequence ``--context`` tokens) and each configuration
  (``DecodeConfig``: tokens per tile, ``tl.range`` pipelining stages, warps, and the splits that give ``per_sm`` programs per SM): one CUDA graph of
  ``--layers`` launches over as many distinct caches (as a step's layers run; the caches
  together are many times the L2), replayed 3 times to warm up and 10 times timed with
  events; the median over the launches is the kernel's time (its combine kernel included),
  and the K/V bytes it must read over that time its bandwidth;
- correctness of every timed configuration: the first layer's output (poisoned before the
  replay) against float32 SDPA over the gathered pages, ``|out - ref| / |ref| < 2e-2``; and
  of every kernel variant once more at B 32 over random lengths 1 .. context, with splits
  1 and 8.

A table per batch, fastest first (the configuration ``kernels.decode_config`` gives marked
``*``; the newest table in ``benchmarks/results/serve_decode_kernel.txt`` chose the present
kernel and rule, ran beside the former CUDA-core form, ``h1``, whose rule ``*`` marks
there), then one line per batch naming the fastest; all rows as JSON lines to ``--json``. Evidence: ``serving-benchmark`` (a GPU's timings; no document: the
table chose the rule that ``kernels.decode_config`` states).

    PYTHONPATH=src python3 benchmarks/serve_decode_kernel.py --json OUT/decode_kernel.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from serve_common import header

from parlab.serve.engine.kernels import DecodeConfig, decode_config, paged_decode


def copy_bandwidth() -> float:
    src = torch.randn((2 << 30) // 4, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    return 2 * src.numel() * 4 / statistics.median(times)


def reference(q, kc, vc, table, lens, scale):
    """float32 attention of each sequence's query over its first ``lens`` cached tokens."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    page, K = kc.shape[1], kc.shape[2]
    R = q.shape[1] // K
    for b in range(q.shape[0]):
        n = int(lens[b])
        pages = table[b, : -(-n // page)]
        k = kc[pages].reshape(-1, K, kc.shape[3])[:n].float().repeat_interleave(R, 1)
        v = vc[pages].reshape(-1, K, kc.shape[3])[:n].float().repeat_interleave(R, 1)
        o = F.scaled_dot_product_attention(
            q[b].float()[:, None], k.transpose(0, 1), v.transpose(0, 1), scale=scale
        )
        out[b] = o[:, 0]
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    e = ((out.float() - ref).norm() / ref.norm()).item()
    return e if math.isfinite(e) else float("inf")


def variants(args: argparse.Namespace):
    """Kernel variants: every tile, stage count and warp count given."""
    for n, s, w in itertools.product(args.tiles, args.stages, args.warps):
        yield {"block_n": n, "stages": s, "warps": w}


def cache(layers: int, pages: int, page: int, K: int, D: int, dev: str):
    shape = (pages + 1, page, K, D)
    ks = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
    vs = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
    return ks, vs


def check_lengths(v: dict, args, ks, vs, table, dev: str, sms: int) -> float:
    """Worst relative error over random lengths at B 32 (or the pool's B), splits 1 and 8."""
    B = min(32, table.shape[0])
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(1, args.context + 1, (B,), generator=g).to(dev)
    q = torch.randn(B, args.heads, args.head_dim, device=dev, dtype=torch.bfloat16)
    scale = args.head_dim**-0.5
    ref = reference(q, ks[0], vs[0], table[:B], lens, scale)
    worst = 0.0
    for s in (1, 8):
        out = torch.full_like(q, float("nan"))
        paged_decode(q, ks[0], vs[0], table[:B], lens, out, scale, DecodeConfig(**v, splits=s))
        worst = max(worst, rel_err(out, ref))
    return worst


def time_graph(fn, reps: int = 10) -> float:
    """Median seconds of one replay of a graph that runs ``fn`` (after 3 warm-ups)."""
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for i in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def sweep_batch(B: int, args, ks, vs, table, sms: int, bw: float, deadline: float, jsonl):
    dev = "cuda"
    N, K, D = args.heads, args.kv_heads, args.head_dim
    scale = D**-0.5
    lens = torch.full((B,), args.context, device=dev)
    tb = table[:B].contiguous()
    q = torch.randn(B, N, D, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty_like(q) for _ in ks]
    ref = reference(q, ks[0], vs[0], tb, lens, scale)
    nbytes = 2 * B * args.context * K * D * 2
    rows, seen = [], set()
    for v in variants(args):
        for p in args.per_sm:
            cfg = decode_config(B, K, sms, per_sm=p, **v)
            if cfg in seen:
                continue
            seen.add(cfg)
            if time.monotonic() > deadline:
                return rows, True
            row = {"batch": B, "page": args.page, **cfg.__dict__, "per_sm": p}
            try:

                def run(cfg=cfg):
                    for layer in range(len(ks)):
                        paged_decode(q, ks[layer], vs[layer], tb, lens, outs[layer], scale, cfg)

                outs[0].fill_(float("nan"))
                t = time_graph(run) / len(ks)
                row |= {"us": t * 1e6, "gbs": nbytes / t / 1e9, "err": rel_err(outs[0], ref)}
                row["frac"] = row["gbs"] * 1e9 / bw
            except Exception as e:  # a configuration that does not compile: recorded
                row |= {"us": None, "error": f"{type(e).__name__}: {str(e)[:120]}"}
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
    return rows, False


def fmt(r: dict, rule: DecodeConfig) -> str:
    fields = ("block_n", "stages", "warps", "splits")
    mark = "*" if all(r[f] == getattr(rule, f) for f in fields) else " "
    cfg = f"n{r['block_n']:<3} st{r['stages']} w{r['warps']} s{r['splits']:<3} P{r['per_sm']:<3}"
    if r["us"] is None:
        return f"{mark} {cfg}  failed: {r['error']}"
    ok = "ok" if r["err"] < 2e-2 else "WRONG"
    return f"{mark} {cfg} {r['us']:9.1f} {r['gbs']:8.0f} {r['frac']:6.2f} {r['err']:9.1e}  {ok}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--batch", type=ints, default=[32, 128, 1])
    ap.add_argument("--context", type=int, default=1040)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tiles", type=ints, default=[32, 64, 128])
    ap.add_argument("--stages", type=ints, default=[2, 3, 4])
    ap.add_argument("--warps", type=ints, default=[4, 8])
    ap.add_argument("--per-sm", type=ints, default=[1, 2, 4, 16, 32])
    ap.add_argument("--seconds", type=float, default=240.0, help="Sweep budget.")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default="/dev/null")
    args = ap.parse_args()
    header("paged decode attention: kernel configurations")
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    pages_per_seq = -(-args.context // args.page)
    n_pages = max(args.batch) * pages_per_seq
    ks, vs = cache(args.layers, n_pages, args.page, args.kv_heads, args.head_dim, "cuda")
    table = (torch.randperm(n_pages, device="cuda") + 1).view(max(args.batch), pages_per_seq)
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs, copy bandwidth {bw / 1e9:.0f} GB/s; "
          f"{args.heads} heads ({args.kv_heads} kv) x {args.head_dim}, page {args.page}, "
          f"context {args.context}, {args.layers} caches of "
          f"{2 * ks[0].numel() * 2 / 1e9:.2f} GB")  # fmt: skip
    with open(args.json, "w") as jsonl:
        checks = {}
        for v in variants(args):
            try:
                checks[str(v)] = check_lengths(v, args, ks, vs, table, "cuda", sms)
            except Exception as e:
                checks[str(v)] = f"{type(e).__name__}: {str(e)[:100]}"
        jsonl.write(json.dumps({"length_checks": checks}) + "\n")
        results, cut = {}, False
        for B in args.batch:
            results[B], cut_b = sweep_batch(B, args, ks, vs, table, sms, bw, deadline, jsonl)
            cut |= cut_b
    bad = {k: e for k, e in checks.items() if not (isinstance(e, float) and e < 2e-2)}
    print(f"# random-length checks: {len(checks) - len(bad)} of {len(checks)} variants ok"
          + "".join(f"\n#   {k}: {e}" for k, e in bad.items()))  # fmt: skip
    if cut:
        print(f"# sweep cut at its budget of {args.seconds:.0f} s: later rows not run")
    best = {}
    for B, rows in results.items():
        default = decode_config(B, args.kv_heads, sms)
        good = [r for r in rows if r["us"] is not None and r["err"] < 2e-2]
        good.sort(key=lambda r: r["us"])
        print(f"\n## batch {B} x {args.context} tokens: {len(rows)} configurations "
              f"(K/V {2 * B * args.context * args.kv_heads * args.head_dim * 2 / 1e6:.1f} MB)")  # fmt: skip
        print("  config                            us/launch    GB/s  of bw  rel err")
        shown = good[: args.top] + [r for r in good[args.top :] if fmt(r, default)[0] == "*"]
        shown += [r for r in rows if r not in good]
        for r in shown:
            print(fmt(r, default))
        if good:
            best[B] = good[0]
    print()
    for B, r in best.items():
        print(f"best at batch {B}: {fmt(r, decode_config(B, args.kv_heads, sms))}")
    print(f"# {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
