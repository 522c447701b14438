"""Sampling on the device: one batched call per step, no per-sequence Python, capturable in a
CUDA graph.

Every row of ``logits_RV`` is masked to the ids a sampler may pick (``allowed_V``: whole,
printable tokens and the stop ids), its stop ids to ``-inf`` where end-of-sequence is not
allowed (``ignore_eos``), then: greedy rows (temperature 0) take the argmax; the others the
Gumbel-max draw ``argmax(logits / T + G)``, which samples the softmax at temperature ``T``
exactly. ``G`` is Gumbel noise from a counter-based hash (SplitMix64's finaliser) of the
row's seed, its output index and the vocabulary id, so a request's draws depend on its seed
alone -- never on its neighbours in the batch or on the step it runs in -- and are the same
on every tensor-parallel rank. With ``top_p`` the scaled logits outside each row's nucleus
(the smallest set of most likely tokens whose probability reaches ``top_p``) are dropped
first (sorting the vocabulary: the step leaves its graph to do it).

Shape suffixes: R rows, V vocabulary.
"""

from __future__ import annotations

import torch


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def uniform(seed_R: torch.Tensor, step_R: torch.Tensor, V: int) -> torch.Tensor:
    """``[R, V]`` float32 in (0, 1): a hash of (seed, step, id); int64 arithmetic wraps."""
    cols = torch.arange(V, device=seed_R.device, dtype=torch.int64)
    x = (seed_R * _GOLDEN + step_R * _MIX1)[:, None] + cols * _MIX2
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def top_p_filter(scaled_RV: torch.Tensor, top_p_R: torch.Tensor) -> torch.Tensor:
    """``scaled_RV`` with every id outside its row's nucleus set to ``-inf`` (the most likely
    id always stays)."""
    srt, idx = scaled_RV.sort(dim=-1, descending=True)
    probs = srt.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    srt = srt.masked_fill(before > top_p_R[:, None], float("-inf"))
    return torch.empty_like(scaled_RV).scatter_(-1, idx, srt)


def sample(
    logits_RV: torch.Tensor,
    *,
    allowed_V: torch.Tensor,
    stop_ids: torch.Tensor,
    temperature_R: torch.Tensor,
    top_p_R: torch.Tensor,
    seed_R: torch.Tensor,
    step_R: torch.Tensor,
    eos_ok_R: torch.Tensor,
    use_top_p: bool = False,
    greedy_only: bool = False,
) -> torch.Tensor:
    """One token id per row (int64 ``[R]``); ``allowed_V``: 0 where an id may be picked,
    ``-inf`` elsewhere; ``eos_ok_R``: rows that may end on a stop id; ``greedy_only``: every
    row greedy (the temperatures unread: no noise drawn)."""
    masked = logits_RV.float() + allowed_V
    penalty = torch.where(eos_ok_R, 0.0, float("-inf")).to(masked.dtype)
    masked[:, stop_ids] += penalty[:, None]
    greedy = masked.argmax(dim=-1)
    if greedy_only:
        return greedy
    scaled = masked / temperature_R.clamp_min(1e-5)[:, None]
    if use_top_p:
        scaled = top_p_filter(scaled, top_p_R)
    gumbel = -torch.log(-torch.log(uniform(seed_R, step_R, masked.shape[1])))
    drawn = (scaled + gumbel).argmax(dim=-1)
    return torch.where(temperature_R > 0, drawn, greedy)
