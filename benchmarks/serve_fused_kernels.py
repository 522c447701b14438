"""The engine's fused Triton kernels between its matrix products against the torch ops they
replace, on one GPU: the residual add + RMSNorm (``kernels_norm.add_rms_norm`` against an
add and ``F.rms_norm``) and SwiGLU's ``silu(gate) * up`` (``kernels_norm.silu_mul`` against
``F.silu`` and a multiply), at a decode step's rows and a prefill step's (1.3B's widths:
hidden 2048, FFN 5632; bf16); and ``kernels.rope_store`` (RoPE of the queries and keys, keys
and values to their page slots) at 16 query and 16 kv heads of 128 (the newest table in
``benchmarks/results/serve_fused_kernels.txt`` ran its former form beside it: ``pair``, each
element's pair partner gathered beside it, against ``split``, the present one).

Each variant is captured 20 times in one CUDA graph (as the engine's decode step replays
them); the time is the median of 10 replays over 20. Evidence ``serving-benchmark``
(a kernel micro-benchmark); the table is all it writes.

    PYTHONPATH=src python3 benchmarks/serve_fused_kernels.py --rows 128,8192
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from serve_common import SRC, header


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds of one ``fn()``: ``reps`` calls in a CUDA graph, median of 10 replays."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def one_row(T: int, H: int, Fw: int, w: torch.Tensor) -> tuple[float, float, float, float]:
    """Microseconds of torch's add + norm, the fused one, torch's silu * up, the fused one."""
    from parlab.serve.engine.kernels_norm import add_rms_norm, silu_mul

    h = torch.randn(T, H, device="cuda", dtype=w.dtype)
    d = torch.randn(T, H, device="cuda", dtype=w.dtype)
    ab = torch.randn(T, 2 * Fw, device="cuda", dtype=w.dtype)

    def torch_norm() -> None:
        F.rms_norm(h + d, (H,), w, 1e-5)

    def torch_silu() -> None:
        a, b = ab.chunk(2, dim=-1)
        F.silu(a) * b

    return (
        graph_us(torch_norm), graph_us(lambda: add_rms_norm(h, d, w, 1e-5)),
        graph_us(torch_silu), graph_us(lambda: silu_mul(ab)),
    )  # fmt: skip


def rope_row(T: int, dt: torch.dtype) -> float:
    """Microseconds of ``rope_store`` over ``T`` tokens."""
    from parlab.models.reference import rope_table
    from parlab.serve.engine.kernels import rope_store

    N = K = 16
    D = 128
    qkv = torch.randn(T, (N + 2 * K) * D, device="cuda", dtype=dt)
    rope = rope_table(torch.arange(T, device="cuda"), D, 1e4)
    slots = torch.randperm(2 * T, device="cuda")[:T]
    kc = torch.empty(2 * T, 1, K, D, device="cuda", dtype=dt)
    vc, q = torch.empty_like(kc), torch.empty(T, N, D, device="cuda", dtype=dt)
    return graph_us(lambda: rope_store(qkv, rope, slots, q, kc, vc, N, K, D))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,32,128,8192")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    args = ap.parse_args()
    header("fused add + RMSNorm and silu(gate) * up against torch")
    H, Fw, dt = args.hidden, args.ffn, torch.bfloat16
    w = torch.randn(H, device="cuda", dtype=dt)
    print(f"{'rows':>6} {'add+norm torch us':>18} {'fused us':>9} {'silu*up torch us':>17} "
          f"{'fused us':>9} {'rope_store us':>14}")  # fmt: skip
    for T in (int(r) for r in args.rows.split(",")):
        tn, fn, ts, fs = one_row(T, H, Fw, w)
        print(f"{T:>6} {tn:>18.1f} {fn:>9.1f} {ts:>17.1f} {fs:>9.1f} {rope_row(T, dt):>14.1f}")


if __name__ == "__main__":
    sys.path.insert(0, SRC)
    main()
