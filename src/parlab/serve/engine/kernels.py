"""Triton kernels of the engine's step on CUDA (imported only there: ``attention.py`` falls back
to torch where Triton is missing).

- ``rope_store``: RoPE of every query and key head of every new token (interleaved pairs, in
  float32, as ``parlab.models.reference.apply_rope``), queries to ``q_out``, keys and values
  into their page slots (``slot = page * block + offset``) -- one kernel instead of a dozen
  elementwise ones and two indexed writes per layer; a program per token, all its heads
  (a program per (token, head) made 262,144 programs of 64 pairs each in a prefill step of
  8,192 tokens of the 1.3B preset). Each head's row is loaded and stored whole (contiguous,
  vectorized) and split into its even and odd elements in registers (``tl.split`` /
  ``tl.join``): 52.4 us at 8,192 tokens of 16 + 16 heads of 128 against 166.8 for the former
  form, which loaded each element's pair partner beside it by a permuted gather
  (``benchmarks/serve_fused_kernels.py``, ``benchmarks/results/serve_fused_kernels.txt``,
  H200, 2026-12-02 18:57).
- ``paged_decode``: attention of one new query token per sequence over that sequence's pages
  (flash-decoding): a program per (sequence, kv head, split) walks its share of the
  sequence's keys in tiles of ``block_n`` tokens (each token's page read from the block
  table; K and V of a tile loaded together, the loop software-pipelined by
  ``tl.range(num_stages=stages)``). The kv head's query heads are the rows of two tensor-core
  products per tile (``tl.dot``, padded to 16 rows: 15 of them idle under MHA, all busy from
  16 query heads per kv head; float32 caches multiply in full float32, not TF32), with an online softmax in float32 (base 2). With one split it
  writes the output itself: one kernel per layer; with several, each writes its partial
  ``(acc, max, sum)`` and ``_combine`` merges them. Work follows each sequence's real
  length (read on the device), so a captured graph replays it at any length.

  The configuration is a fixed rule (``decode_config``), chosen by measurement offline:
  ``benchmarks/serve_decode_kernel.py`` timed this form beside the former CUDA-core one
  (one query head a program, products and sums in float32 registers) over tiles of 32, 64
  and 128 tokens, 2 or 3 stages, 4 or 8 warps, 1 to 32 programs per SM, each in a CUDA graph
  over 8 distinct caches, at batch 1, 32 and 128 of 1,040 tokens (1.3B's 16 heads of 128,
  bf16) on an H200 (``benchmarks/results/serve_decode_kernel.txt``, 2026-12-02 18:58; every
  row checked against float32 SDPA). 64-token tiles, 3 stages, 4 warps and the fewest splits
  that give one program per SM: the fastest at batch 128 (259.5 us, 4.20 TB/s, 0.99 of the
  copy bandwidth, against 330.0 us for the former rule) and at batch 32 (69.4 us, 0.92,
  against 92.0); at batch 1 (16 splits) 10.2 us, against 9.2 for the fastest and 11.8 for
  the former rule. More splits than that were slower at batch 32 and 128. Triton's autotune
  is not used: tried once, it tuned at capture time on the padding rows of length 1 and
  chose tiles that ran the 128-sequence step at 21.5 ms against 14.4 ms
  (results/PAR-DISTRIBUTED-INFERENCE/serve-engine-step-20261202T035816-f0e20b.json and
  -20261202T033323-7f2176.json).

Shape suffixes: T tokens, B sequences, N query heads, K kv heads, D head dim, S splits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store(
    qkv,
    cs,
    slots,
    q_out,
    k_cache,
    v_cache,
    stride_t,
    stride_q,
    N,
    K,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROPE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)  # query heads, then key heads
    d = tl.arange(0, BLOCK_D)
    m = (h < N + K)[:, None] & (d < D)[None, :]
    row = qkv + t * stride_t + h[:, None] * D
    x = tl.load(row + d[None, :], mask=m, other=0.0).to(tl.float32)
    if ROPE:
        # pairs (x[2i], x[2i+1]) -> (x[2i] c - x[2i+1] s, x[2i+1] c + x[2i] s)
        xe, xo = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_D // 2, 2]))
        i = tl.arange(0, BLOCK_D // 2)
        im = 2 * i < D
        c = tl.load(cs + t * D + 2 * i, mask=im, other=0.0)[None, :]
        s = tl.load(cs + t * D + 2 * i + 1, mask=im, other=0.0)[None, :]
        y = tl.reshape(tl.join(xe * c - xo * s, xo * c + xe * s), [BLOCK_H, BLOCK_D])
    else:
        y = x
    qm = m & (h < N)[:, None]
    tl.store(
        q_out + t * stride_q + h[:, None] * D + d[None, :], y.to(q_out.dtype.element_ty), mask=qm
    )
    slot = tl.load(slots + t)
    km = m & (h >= N)[:, None]
    kdst = k_cache + slot * (K * D) + (h - N)[:, None] * D + d[None, :]
    tl.store(kdst, y.to(k_cache.dtype.element_ty), mask=km)
    j = tl.arange(0, BLOCK_V)
    vm = j < K * D
    vv = tl.load(qkv + t * stride_t + (N + K) * D + j, mask=vm)
    tl.store(v_cache + slot * (K * D) + j, vv, mask=vm)


def rope_store(
    qkv_TX: torch.Tensor,
    rope_TD2: torch.Tensor | None,
    slots_T: torch.Tensor,
    q_TND: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    N: int,
    K: int,
    D: int,
) -> None:
    """``q_TND`` = RoPE(queries); the rotated keys and the values to their slots."""
    T = qkv_TX.shape[0]
    cs = rope_TD2 if rope_TD2 is not None else qkv_TX  # unused without RoPE
    if rope_TD2 is not None:
        assert rope_TD2.is_contiguous() and rope_TD2.shape[-2:] == (D // 2, 2)
    block_h, block_d = triton.next_power_of_2(N + K), triton.next_power_of_2(D)
    _rope_store[(T,)](
        qkv_TX,
        cs,
        slots_T,
        q_TND,
        k_cache,
        v_cache,
        qkv_TX.stride(0),
        q_TND.stride(0),
        N,
        K,
        D=D,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_V=triton.next_power_of_2(K * D),
        ROPE=rope_TD2 is not None,
        num_warps=8 if block_h * block_d >= 4096 else 4,
    )


@triton.jit
def _paged_decode(
    q,
    k_cache,
    v_cache,
    table,
    lens,
    out,
    part_o,
    part_ml,
    scale,
    stride_qb,
    stride_tb,
    N,
    K,
    R,
    SPLITS,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    r = tl.arange(0, ROWS)
    h = kvh * R + r  # the kv head's query heads, padded to ROWS rows
    L = tl.load(lens + b)
    per = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per
    hi = tl.minimum(lo + per, L)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    hd = (r < R)[:, None] & dm[None, :]
    qv = tl.load(q + b * stride_qb + h[:, None] * D + d[None, :], mask=hd, other=0.0)
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        page = tl.load(table + b * stride_tb + n // PAGE, mask=nm, other=0)
        row = (page.to(tl.int64) * PAGE + n % PAGE) * (K * D) + kvh * D
        m2 = nm[:, None] & dm[None, :]
        k = tl.load(k_cache + row[:, None] + d[None, :], mask=m2, other=0.0)  # ND
        v = tl.load(v_cache + row[:, None] + d[None, :], mask=m2, other=0.0)
        s = tl.dot(qv, tl.trans(k), input_precision=PRECISION) * qk_scale  # rows x N
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    hm = r < R
    if DIRECT:
        o = acc / l_i[:, None]
        tl.store(
            out + b * (N * D) + h[:, None] * D + d[None, :], o.to(out.dtype.element_ty), mask=hd
        )
    else:
        base = (b * N + h) * SPLITS + sp
        tl.store(part_o + base[:, None] * BLOCK_D + d[None, :], acc, mask=hd)
        tl.store(part_ml + base * 2, m_i, mask=hm)
        tl.store(part_ml + base * 2 + 1, l_i, mask=hm)


@triton.jit
def _combine(
    part_o,
    part_ml,
    out,
    N,
    SPLITS,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    sm = sp < SPLITS
    base = (b * N + h) * SPLITS + sp
    m = tl.load(part_ml + base * 2, mask=sm, other=float("-inf"))
    lsum = tl.load(part_ml + base * 2 + 1, mask=sm, other=0.0)
    mx = tl.max(m, axis=0)
    w = tl.where(lsum > 0, tl.exp2(m - mx), 0.0)
    total = tl.sum(w * lsum, axis=0)
    d = tl.arange(0, BLOCK_D)
    o = tl.load(part_o + base[:, None] * BLOCK_D + d[None, :], mask=sm[:, None], other=0.0)
    res = tl.sum(w[:, None] * o, axis=0) / total
    tl.store(out + b * (N * D) + h * D + d, res.to(out.dtype.element_ty), mask=d < D)


@dataclass(frozen=True)
class DecodeConfig:
    """How ``paged_decode`` runs: tokens per tile, the loop's software-pipelining depth
    (``tl.range``'s ``num_stages``), warps per program and splits per (sequence, kv head).
    ``decode_config`` gives the engine's."""

    block_n: int = 64
    stages: int = 3
    warps: int = 4
    splits: int = 1


def decode_config(B: int, K: int, sms: int, *, per_sm: int = 1, **knobs: int) -> DecodeConfig:
    """The decode kernel's configuration for a bucket of ``B`` sequences of ``K`` kv heads
    on ``sms`` multiprocessors: ``DecodeConfig``'s defaults, and splits a power of two (at
    most 64), the fewest that give ``per_sm`` programs per SM; ``knobs`` override the
    fields."""
    groups = B * K
    s = 1
    while groups * s < per_sm * sms and s < 64:
        s *= 2
    return DecodeConfig(**{**asdict(DecodeConfig(**knobs)), "splits": s})


def paged_decode(
    q_BND: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table_BM: torch.Tensor,
    lens_B: torch.Tensor,
    out_BND: torch.Tensor,
    scale: float,
    cfg: DecodeConfig,
) -> None:
    """``out_BND`` = attention of each sequence's query over its ``lens_B`` cached tokens,
    run as ``cfg`` says."""
    B, N, D = q_BND.shape
    K = k_cache.shape[2]
    page = k_cache.shape[1]
    block_d = max(16, triton.next_power_of_2(D))  # tl.dot's inner size is at least 16
    S = cfg.splits
    part_o = part_ml = out_BND
    if S > 1:
        part_o = torch.empty((B, N, S, block_d), device=q_BND.device, dtype=torch.float32)
        part_ml = torch.empty((B, N, S, 2), device=q_BND.device, dtype=torch.float32)
    rows = max(16, triton.next_power_of_2(N // K))
    _paged_decode[(B, K, S)](
        q_BND, k_cache, v_cache, table_BM, lens_B, out_BND, part_o, part_ml, scale,
        q_BND.stride(0), table_BM.stride(0), N, K, N // K, S, D=D, BLOCK_D=block_d, PAGE=page,
        ROWS=rows, BLOCK_N=cfg.block_n, STAGES=cfg.stages, DIRECT=S == 1,
        PRECISION="ieee" if q_BND.dtype == torch.float32 else "tf32", num_warps=cfg.warps,
    )  # fmt: skip
    if S > 1:
        _combine[(B, N)](
            part_o, part_ml, out_BND, N, S, D=D, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(S)
        )
