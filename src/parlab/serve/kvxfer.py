"""KV-cache transfer between two ranks: the wire cost of the prefill/decode split.

Rank 0 (prefill) sends one request's KV blocks with ``dist.send`` -- one contiguous tensor
``[layers, 2, kv_heads, tokens, head_dim]`` in the model's dtype (``tokens *
kv_bytes_per_token`` bytes) -- and rank 1 (decode) receives them with ``dist.recv`` (NCCL
point-to-point on GPUs, gloo on the CPU). After a barrier the receiver times ``recv`` and a
device synchronise with ``time.perf_counter``: ``warmup`` transfers, then the mean of
``iters``; it checks every element (``wrong``). ``fit``'s ``time = base_s + bytes /
bandwidth`` is what the simulator's disaggregated mode takes.

Shape suffixes: L layers, K kv heads, T tokens, D head dim.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from parlab.runtime.context import RankContext

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """K and V of one token in every layer."""
    return layers * 2 * kv_heads * head_dim * torch.tensor([], dtype=DTYPES[dtype]).element_size()


def rank_main(
    ctx: RankContext,
    *,
    tokens: list[int],
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: str = "bfloat16",
    iters: int = 10,
    warmup: int = 3,
) -> dict[str, Any]:
    """Measure send/recv of one request's KV blocks for each token count (ranks 0 -> 1)."""
    assert ctx.world_size >= 2, "KV transfer needs two ranks"
    dt = DTYPES[dtype]
    rows = []
    for t in tokens:
        shape_LKTD = (layers, 2, kv_heads, t, head_dim)
        n = int(np.prod(shape_LKTD))
        if ctx.rank == 0:
            kv = (torch.arange(n, device=ctx.device) % 251).to(dt).view(shape_LKTD)
        else:
            kv = torch.empty(shape_LKTD, device=ctx.device, dtype=dt)
        times = []
        for i in range(warmup + iters):
            if ctx.rank == 1:
                kv.zero_()
            ctx.sync()
            dist.barrier()
            t0 = time.perf_counter()
            if ctx.rank == 0:
                dist.send(kv, dst=1)
            elif ctx.rank == 1:
                dist.recv(kv, src=0)
            ctx.sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        wrong = 0
        if ctx.rank == 1:
            ref = (torch.arange(n, device=ctx.device) % 251).to(dt).view(shape_LKTD)
            wrong = int((kv != ref).sum())
        nbytes = n * kv.element_size()
        rows.append(
            {
                "tokens": t,
                "bytes": nbytes,
                "time_s": float(np.mean(times)),
                "min_s": float(np.min(times)),
                "wrong": wrong,
            }
        )
        del kv
    return {"rank": ctx.rank, "rows": rows, "backend": ctx.backend}


def fit(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """``time = base_s + bytes / bandwidth`` by least squares (bandwidth in bytes/s);
    ``None`` where the fit has no basis (one size, or times not growing with size)."""
    b = np.asarray([r["bytes"] for r in rows], dtype=np.float64)
    t = np.asarray([r["time_s"] for r in rows], dtype=np.float64)
    if len(rows) < 2 or np.ptp(b) == 0:
        return {"base_s": None, "bandwidth": None}
    slope, base = np.polyfit(b, t, 1)
    return {
        "base_s": max(float(base), 0.0),
        "bandwidth": float(1.0 / slope) if slope > 0 else None,
    }
