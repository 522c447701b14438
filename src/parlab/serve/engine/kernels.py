"""Triton kernels of the engine's step on CUDA (imported only there: ``attention.py`` falls back
to torch where Triton is missing).

- ``rope_store``: RoPE of every query and key head of every new token (interleaved pairs, in
  float32, as ``parlab.models.reference.apply_rope``), queries to ``q_out``, keys and values
  into their page slots (``slot = page * block + offset``) -- one kernel instead of a dozen
  elementwise ones and two indexed writes per layer; a program per token, all its heads
  (a program per (token, head) made 262,144 programs of 64 pairs each in a prefill step of
  8,192 tokens of the 1.3B preset). Each head's row is loaded and stored whole (contiguous,
  vectorized), each element's pair partner read beside it, not split into even and odd
  elements at a stride of two: 169 against 590 us a layer of an 8,129-token mixed step (the
  profile part of ``scripts/gpu/serving_engine.sh``: ``results/logs/gpu-20261202T1549-*`` and
  ``gpu-20261202T1510-*``).
- ``paged_decode``: attention of one new query token per sequence over that sequence's pages
  (flash-decoding): a program per (sequence, group of ``heads`` query heads, split) walks its
  share of the sequence's keys in tiles of ``block_n`` tokens (each token's page read from the
  block table; K and V of a tile loaded together, the loop software-pipelined by
  ``tl.range(num_stages=stages)``), with an online softmax in float32 (base 2). With one
  split it writes the output itself: one kernel per layer; with several, each writes its
  partial ``(acc, max, sum)`` and ``_combine`` merges them. Work follows each sequence's real
  length (read on the device), so a captured graph replays it at any length.

  The configuration is a fixed rule (``decode_config``), chosen by measurement offline:
  ``benchmarks/serve_decode_kernel.py`` timed 48 kernel variants (1, 2 or 4 heads per
  program; tiles of 16, 32 or 64 tokens; 1, 2 or 3 stages; 4 or 8 warps) at 1 to 32 programs
  per SM, each in a CUDA graph over 8 distinct caches, at batch 1, 32 and 128 of 1,040 tokens
  (1.3B's 16 heads of 128, bf16) on an H200 (``benchmarks/results/serve_decode_kernel.txt``;
  every row checked against float32 SDPA). One head per program, 64-token tiles, 2 stages and
  4 warps: the fastest at batch 32 (93 us, 2.93 TB/s of the 4.21 TB/s copy bandwidth, one
  split), within 1 % of the fastest at batch 128 (350 us, 3.12 TB/s), 12.1 us at batch 1
  against 11.3 for the fastest (1 stage); the former rule (32-token tiles, 1 stage) ran 157,
  464 and 14.4 us. Splits: the fewest (a power of two)
  giving 2 programs per SM -- one from 264 (sequence, head) pairs; more splits were no faster
  at batch 32 or 128, and at batch 1 (32 splits, 12 us) a few us apart. A second run beside
  128-token tiles: 328 us at batch 128 against 351, slower at batch 32 (104 against 93), so
  the long tile is taken from ``LARGE_TILE_PER_SM`` programs per SM. Triton's autotune
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
    md = d < D
    m = (h < N + K)[:, None] & md[None, :]
    row = qkv + t * stride_t + h[:, None] * D
    x = tl.load(row + d[None, :], mask=m, other=0.0).to(tl.float32)
    if ROPE:
        odd = d % 2
        # y[2i] = x[2i] c - x[2i+1] s, y[2i+1] = x[2i+1] c + x[2i] s: x and its pair partner
        xp = tl.load(row + (d + 1 - 2 * odd)[None, :], mask=m, other=0.0).to(tl.float32)
        c = tl.load(cs + t * D + d - odd, mask=md, other=0.0)
        s = tl.load(cs + t * D + d - odd + 1, mask=md, other=0.0)
        s = tl.where(odd == 1, s, -s)
        y = x * c[None, :] + xp * s[None, :]
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


@triton.jit
def _rope_store_split(
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
    split: bool = False,
) -> None:
    """``q_TND`` = RoPE(queries); the rotated keys and the values to their slots."""
    T = qkv_TX.shape[0]
    cs = rope_TD2 if rope_TD2 is not None else qkv_TX  # unused without RoPE
    if rope_TD2 is not None:
        assert rope_TD2.is_contiguous() and rope_TD2.shape[-2:] == (D // 2, 2)
    block_h, block_d = triton.next_power_of_2(N + K), triton.next_power_of_2(D)
    (_rope_store_split if split else _rope_store)[(T,)](
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
    HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    DIRECT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    sp = tl.program_id(2)
    L = tl.load(lens + b)
    per = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per
    hi = tl.minimum(lo + per, L)
    d = tl.arange(0, BLOCK_D)
    hd = (h < N)[:, None] & (d < D)[None, :]  # HD
    q_off = b * stride_qb + h[:, None] * D + d[None, :]
    qv = tl.load(q + q_off, mask=hd, other=0.0).to(tl.float32) * (scale * 1.4426950408889634)
    kv_off = (h // R)[:, None] * D + d[None, :]  # HD
    m_i = tl.full([HEADS], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([HEADS], tl.float32)
    acc = tl.zeros([HEADS, BLOCK_D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        page = tl.load(table + b * stride_tb + n // PAGE, mask=nm, other=0)
        off = (page * PAGE + n % PAGE)[:, None, None] * (K * D) + kv_off[None, :, :]  # NHD
        m3 = nm[:, None, None] & hd[None, :, :]
        k = tl.load(k_cache + off, mask=m3, other=0.0)
        v = tl.load(v_cache + off, mask=m3, other=0.0)
        s = tl.sum(k.to(tl.float32) * qv[None, :, :], axis=2)  # NH
        s = tl.where(nm[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32), axis=0)
        m_i = m_new
    if DIRECT:
        o = acc / l_i[:, None]
        tl.store(
            out + b * (N * D) + h[:, None] * D + d[None, :], o.to(out.dtype.element_ty), mask=hd
        )
    else:
        base = (b * N + h) * SPLITS + sp  # H
        tl.store(part_o + base[:, None] * BLOCK_D + d[None, :], acc, mask=hd)
        tl.store(part_ml + base * 2, m_i, mask=h < N)
        tl.store(part_ml + base * 2 + 1, l_i, mask=h < N)


@triton.jit
def _paged_decode_dot(
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
        s = tl.dot(qv, tl.trans(k)) * qk_scale  # rows x N
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
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
    """How ``paged_decode`` runs: query heads per program, tokens per tile, the loop's
    software-pipelining depth (``tl.range``'s ``num_stages``), warps per program and splits
    per (sequence, head group). ``decode_config`` gives the engine's."""

    heads: int = 1
    block_n: int = 64
    stages: int = 2
    warps: int = 4
    splits: int = 1
    dot: int = 0
    """1: the tensor-core form (``_paged_decode_dot``): a program per (sequence, kv head,
    split), its query heads the rows of ``tl.dot`` (padded to 16); ``heads`` unused."""


LARGE_TILE_PER_SM = 8
"""Programs per SM from which the decode kernel takes tiles twice as long. Measured on an
H200 (132 SMs, 1.3B's 16 heads of 128, 1,040 tokens; ``benchmarks/results/
serve_decode_kernel.txt``): 128-token tiles against 64 ran 328 against 351 us at batch 128
(2,048 programs, 15.5 per SM) and 104 against 93 us at batch 32 (512, 3.9 per SM); 8 lies
between the two."""


def decode_tile(head_dim: int, large: bool = False) -> int:
    """Tokens per tile: 8,192 elements of K (and of V) per tile -- 64 tokens of a 128-wide
    head, the only width measured -- or 16,384 where ``large`` (many programs per SM), 16 to
    128 tokens."""
    return max(16, min(128, (16384 if large else 8192) // triton.next_power_of_2(head_dim)))


def decode_config(
    B: int, N: int, D: int, sms: int, *, per_sm: int = 2, **knobs: int
) -> DecodeConfig:
    """The decode kernel's configuration for a bucket of ``B`` sequences of ``N`` query
    heads of width ``D`` on ``sms`` multiprocessors: ``DecodeConfig``'s defaults, the tile
    ``decode_tile(D)`` (the large one from ``LARGE_TILE_PER_SM`` programs per SM), and splits
    a power of two (at most 64), the fewest that give ``per_sm`` programs per SM; ``knobs``
    override the fields."""
    heads = knobs.get("heads", DecodeConfig.heads)
    large = B * -(-N // heads) >= LARGE_TILE_PER_SM * sms
    cfg = DecodeConfig(**{"block_n": decode_tile(D, large), **knobs})
    groups = B * -(-N // cfg.heads)
    s = 1
    while groups * s < per_sm * sms and s < 64:
        s *= 2
    return DecodeConfig(**{**asdict(cfg), "splits": s})


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
    block_d = triton.next_power_of_2(D)
    S = cfg.splits
    part_o = part_ml = out_BND
    if S > 1:
        part_o = torch.empty((B, N, S, block_d), device=q_BND.device, dtype=torch.float32)
        part_ml = torch.empty((B, N, S, 2), device=q_BND.device, dtype=torch.float32)
    common = dict(D=D, BLOCK_D=block_d, PAGE=page, BLOCK_N=cfg.block_n, STAGES=cfg.stages)
    args = (q_BND, k_cache, v_cache, table_BM, lens_B, out_BND, part_o, part_ml, scale,
            q_BND.stride(0), table_BM.stride(0), N, K, N // K, S)  # fmt: skip
    if cfg.dot:
        rows = max(16, triton.next_power_of_2(N // K))
        _paged_decode_dot[(B, K, S)](*args, **common, ROWS=rows, DIRECT=S == 1, num_warps=cfg.warps)
    else:
        _paged_decode[(B, triton.cdiv(N, cfg.heads), S)](
            *args, **common, HEADS=cfg.heads, DIRECT=S == 1, num_warps=cfg.warps
        )
    if S > 1:
        _combine[(B, N)](
            part_o, part_ml, out_BND, N, S, D=D, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(S)
        )
