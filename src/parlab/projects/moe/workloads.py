"""The routing workloads' draws, the same on the CPU as in the run: each rank's tokens, the
experts they are forced to (Zipf ranks mapped by ``hot_order``), and the dispatch plans."""

from __future__ import annotations

import torch

from parlab.models.router import Router, sample_experts, zipf_probabilities
from parlab.projects.moe.config import MoERunConfig


def draw_tokens(
    cfg: MoERunConfig, rank: int, salt: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Rank ``rank``'s tokens for workload ``salt`` (``tokens x hidden``, seeded per rank)."""
    g = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + rank * 131 + salt)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g, device=device, dtype=torch.float32).to(
        dtype
    )


def hot_order(experts: int, ep: int, hot: str) -> list[int]:
    """The expert that gets Zipf rank j (``contiguous``: j; ``spread``: round-robin over ranks)."""
    L = experts // ep
    if hot == "contiguous":
        return list(range(experts))
    return [(j % ep) * L + j // ep for j in range(experts)]


def forced_experts(cfg: MoERunConfig, rank: int, salt: int, skew: float) -> torch.Tensor:
    """The ``topk`` experts each of rank ``rank``'s tokens goes to: a Zipf(``skew``) draw."""
    g = torch.Generator().manual_seed(cfg.seed * 104_729 + rank * 7 + salt)
    probs = zipf_probabilities(cfg.experts, skew)
    idx = sample_experts(cfg.tokens, cfg.experts, cfg.topk, probs, g)
    return torch.tensor(hot_order(cfg.experts, cfg.ep, cfg.hot))[idx]


def dispatch_plans(cfg: MoERunConfig) -> dict[str, list[list[list[int]]]]:
    """Each workload's dispatch plan -- tokens each rank sends to each expert, ``[src][dst][l]``
    -- from the routing alone, on the CPU, with no process group (``parlab project moe --plan``).

    It is what the run will exchange: the same tokens, draws and router (fp32 here; a bf16
    run can break a probability-policy tie differently)."""
    L = cfg.experts // cfg.ep
    out = {}
    for salt, (name, skew) in enumerate(cfg.workloads()):
        plans = []
        for r in range(cfg.ep):
            router = Router(cfg.hidden, cfg.router_config())
            router.reset(cfg.seed)
            x = draw_tokens(cfg, r, salt, torch.device("cpu"), torch.float32)
            with torch.no_grad():
                routing = router(x, forced_experts(cfg, r, salt, skew))
            counts = routing.counts(cfg.experts, kept=True).view(cfg.ep, L)
            plans.append(counts.tolist())
        out[name] = plans
    return out
