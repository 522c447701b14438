"""Triton kernels of the engine's step on CUDA (imported only there: ``attention.py`` falls back
to torch where Triton is missing).

- ``rope_store``: RoPE of every query and key head of every new token (interleaved pairs, in
  float32, as ``parlab.models.reference.apply_rope``), queries to ``q_out``, keys and values
  into their page slots (``slot = page * block + offset``) -- one kernel instead of a dozen
  elementwise ones and two indexed writes per layer.
- ``paged_decode``: attention of one new query token per sequence over that sequence's pages
  (flash-decoding): a program per (sequence, query head, split) walks its share of the
  sequence's keys in tiles of ``BLOCK_N`` tokens (``decode_tile``: a fixed choice -- Triton's
  autotune, tried once, tuned at capture time on the padding rows of length 1 and chose
  16-token tiles that ran the 128-sequence step at 21.5 ms against 14.4 ms for these,
  results/PAR-DISTRIBUTED-INFERENCE/serve-engine-step-20261202T035816-f0e20b.json and
  -20261202T033323-7f2176.json), each token's page read from the block
  table, with an online softmax in float32. With one split (``B * heads`` fills the GPU) it
  writes the output itself: one kernel per layer; with several, each writes its partial
  ``(acc, max, sum)`` and ``_combine`` merges them. Work follows each sequence's real length
  (read on the device), so a captured graph replays it at any length.

Shape suffixes: T tokens, B sequences, N query heads, K kv heads, D head dim, S splits.
"""

from __future__ import annotations

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
    HALF: tl.constexpr,
    ROPE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    m = i < D // 2
    src = qkv + t * stride_t + h * D
    x0 = tl.load(src + 2 * i, mask=m).to(tl.float32)
    x1 = tl.load(src + 2 * i + 1, mask=m).to(tl.float32)
    if ROPE:
        c = tl.load(cs + t * D + 2 * i, mask=m)
        s = tl.load(cs + t * D + 2 * i + 1, mask=m)
        y0 = x0 * c - x1 * s
        y1 = x0 * s + x1 * c
    else:
        y0 = x0
        y1 = x1
    if h < N:
        dst = q_out + t * stride_q + h * D
        tl.store(dst + 2 * i, y0.to(q_out.dtype.element_ty), mask=m)
        tl.store(dst + 2 * i + 1, y1.to(q_out.dtype.element_ty), mask=m)
    else:
        slot = tl.load(slots + t)
        kh = h - N
        dst = k_cache + slot * (K * D) + kh * D
        tl.store(dst + 2 * i, y0.to(k_cache.dtype.element_ty), mask=m)
        tl.store(dst + 2 * i + 1, y1.to(k_cache.dtype.element_ty), mask=m)
        vsrc = qkv + t * stride_t + (N + K + kh) * D
        vdst = v_cache + slot * (K * D) + kh * D
        tl.store(vdst + 2 * i, tl.load(vsrc + 2 * i, mask=m), mask=m)
        tl.store(vdst + 2 * i + 1, tl.load(vsrc + 2 * i + 1, mask=m), mask=m)


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
    _rope_store[(T, N + K)](
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
        HALF=triton.next_power_of_2(max(D // 2, 1)),
        ROPE=rope_TD2 is not None,
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
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    kvh = h // R
    L = tl.load(lens + b)
    per = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per
    hi = tl.minimum(lo + per, L)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    qv = tl.load(q + b * stride_qb + h * D + d, mask=dm, other=0.0).to(tl.float32) * scale
    m_i = tl.zeros([1], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        page = tl.load(table + b * stride_tb + n // PAGE, mask=nm, other=0)
        slot = page * PAGE + n % PAGE
        off = slot[:, None] * (K * D) + kvh * D + d[None, :]
        km = nm[:, None] & dm[None, :]
        k = tl.load(k_cache + off, mask=km, other=0.0).to(tl.float32)
        s = tl.sum(k * qv[None, :], axis=1)
        s = tl.where(nm, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = tl.load(v_cache + off, mask=km, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    if SPLITS == 1:
        o = acc / l_i
        tl.store(out + b * (N * D) + h * D + d, o.to(out.dtype.element_ty), mask=dm)
    else:
        base = (b * N + h) * SPLITS + sp
        tl.store(part_o + base * BLOCK_D + d, acc)
        ml = tl.arange(0, 2)
        vals = tl.where(ml == 0, tl.sum(m_i, axis=0), tl.sum(l_i, axis=0))
        tl.store(part_ml + base * 2 + ml, vals)


@triton.jit
def _combine(
    part_o,
    part_ml,
    out,
    N,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    base = (b * N + h) * SPLITS + sp
    m = tl.load(part_ml + base * 2)
    lsum = tl.load(part_ml + base * 2 + 1)
    mx = tl.max(m, axis=0)
    w = tl.where(lsum > 0, tl.exp(m - mx), 0.0)
    total = tl.sum(w * lsum, axis=0)
    d = tl.arange(0, BLOCK_D)
    o = tl.load(part_o + base[:, None] * BLOCK_D + d[None, :])
    res = tl.sum(w[:, None] * o, axis=0) / total
    tl.store(out + b * (N * D) + h * D + d, res.to(out.dtype.element_ty), mask=d < D)


def decode_splits(B: int, N: int, sms: int) -> int:
    """Splits per (sequence, head) so that about two programs per SM run: a power of two,
    1 (one kernel per layer) from ``B * N >= 2 * sms``, at most 32."""
    s = 1
    while B * N * s < 2 * sms and s < 32:
        s *= 2
    return s


def decode_tile(head_dim: int) -> int:
    """Tokens per tile of the decode kernel: 32 for a 128-wide head (16 KiB of K and V per
    tile in bf16), wider for narrower heads, 16 to 64."""
    return max(16, min(64, 4096 // triton.next_power_of_2(head_dim)))


def paged_decode(
    q_BND: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table_BM: torch.Tensor,
    lens_B: torch.Tensor,
    out_BND: torch.Tensor,
    scale: float,
    splits: int,
    block_n: int | None = None,
) -> None:
    """``out_BND`` = attention of each sequence's query over its ``lens_B`` cached tokens;
    ``block_n``: the tile, tokens (default ``decode_tile``)."""
    B, N, D = q_BND.shape
    K = k_cache.shape[2]
    page = k_cache.shape[1]
    block_d = triton.next_power_of_2(D)
    part_o = part_ml = out_BND
    if splits > 1:
        part_o = torch.empty((B, N, splits, block_d), device=q_BND.device, dtype=torch.float32)
        part_ml = torch.empty((B, N, splits, 2), device=q_BND.device, dtype=torch.float32)
    _paged_decode[(B, N, splits)](
        q_BND,
        k_cache,
        v_cache,
        table_BM,
        lens_B,
        out_BND,
        part_o,
        part_ml,
        scale,
        q_BND.stride(0),
        table_BM.stride(0),
        N,
        K,
        N // K,
        D=D,
        BLOCK_D=block_d,
        PAGE=page,
        SPLITS=splits,
        BLOCK_N=block_n or decode_tile(D),
        num_warps=4,
    )
    if splits > 1:
        _combine[(B, N)](part_o, part_ml, out_BND, N, D=D, BLOCK_D=block_d, SPLITS=splits)
