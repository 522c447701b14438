"""Exact patterns: the values a collective's check writes and expects, bit-exact in every dtype.

Tensor-only: nothing here joins a process group. Inputs are small integers that every dtype
holds exactly, so every correct result is bit-exact and ``#wrong`` counts differing elements,
as nccl-tests does. Element ``g`` of a pattern is ``g % M + 1``; reductions scale rank ``r``'s
input by ``r + 1`` (or by 1 when n(n+1)/2 would overflow the dtype's exact range) and ``M`` is
chosen so the reduced value stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parlab.comm.ops import FP8, SPECS

EXACT_INT: dict[torch.dtype, int] = {
    torch.float32: 2**24,
    torch.float16: 2**11,
    torch.bfloat16: 2**8,
    torch.float64: 2**53,
    torch.int8: 127,
    torch.uint8: 255,
    torch.int32: 2**31 - 1,
    torch.int64: 2**53,
    torch.float8_e4m3fn: 16,
    torch.float8_e5m2: 8,
}
"""Largest integer the dtype (and the float64 used for checking) holds exactly."""


@dataclass(frozen=True, kw_only=True)
class Pattern:
    """The exactly representable values a check uses: element g is ``g % modulus + 1``."""

    modulus: int
    """Period of the pattern (at least 1)."""
    scale_by_rank: bool
    """Reductions: rank r's input is scaled by r + 1 (else by 1)."""
    exact: bool
    """False when no pattern keeps the reduced values exact (the check is skipped)."""

    def rank_scale(self, rank: int) -> int:
        return rank + 1 if self.scale_by_rank else 1

    def total_scale(self, n: int) -> int:
        """The scale of a sum over ``n`` ranks."""
        return n * (n + 1) // 2 if self.scale_by_rank else n


def pattern_for(op: str, dtype: torch.dtype, n: int) -> Pattern:
    """The pattern for ``op`` in ``dtype`` over ``n`` ranks."""
    limit = EXACT_INT[dtype]
    if not SPECS[op].reduces:
        return Pattern(modulus=min(limit, 1 << 20), scale_by_rank=False, exact=True)
    tri = n * (n + 1) // 2
    if tri <= limit:
        return Pattern(modulus=min(limit // tri, 1 << 20), scale_by_rank=True, exact=True)
    if n <= limit:
        return Pattern(modulus=max(1, limit // n), scale_by_rank=False, exact=True)
    return Pattern(modulus=1, scale_by_rank=False, exact=False)


CHUNK = 1 << 24
"""Elements filled or checked at a time, so checks of multi-GiB buffers need little memory."""


def fill(t: torch.Tensor, start: int, pattern: Pattern, scale: int = 1) -> None:
    """Write ``scale * ((start + i) % M + 1)`` into the 1-D tensor ``t``."""
    for lo in range(0, t.numel(), CHUNK):
        hi = min(t.numel(), lo + CHUNK)
        idx = torch.arange(start + lo, start + hi, device=t.device, dtype=torch.int64)
        vals = (idx % pattern.modulus + 1) * scale
        t[lo:hi].copy_(vals.to(torch.float64) if t.dtype in FP8 else vals)


def count_wrong(t: torch.Tensor, start: int, pattern: Pattern, scale: int = 1) -> int:
    """How many elements of ``t`` differ from ``scale * ((start + i) % M + 1)`` (exactly)."""
    wrong = 0
    for lo in range(0, t.numel(), CHUNK):
        hi = min(t.numel(), lo + CHUNK)
        idx = torch.arange(start + lo, start + hi, device=t.device, dtype=torch.int64)
        want = ((idx % pattern.modulus + 1) * scale).to(torch.float64)
        wrong += int((t[lo:hi].to(torch.float64) != want).sum().item())
    return wrong
