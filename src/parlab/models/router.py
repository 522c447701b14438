"""Token -> expert routing: gating, capacity, dropping, load balancing (no process group).

The one router of parlab's MoE layers (``parlab.models.moe.MoE``, the reference model's MoE
blocks, and their expert-parallel shards). Nothing crosses the wire here: the router runs on
each rank's own tokens. Its output (``Routing``) is what the expert-parallel layer turns into
a dispatch plan (``parlab.parallel.expert_comm``). Load counts that must be global (for the
aux-loss-free bias update) are all-reduced by the caller.

Gating (``RouterConfig.gating``):
- ``softmax``: probabilities ``p = softmax(x W)``; the top-k experts by
  ``p + bias``; gate weights are ``p`` at those experts (renormalised over
  the k when ``normalize_weights``; off by default, as in Switch/GShard).
- ``sigmoid`` (DeepSeek-V3): affinities ``s = sigmoid(x W)``; the top-k
  by ``s + bias``; gate weights are ``s`` at those experts divided by their
  sum (``normalize_weights`` defaults to on).

The bias only steers *selection*; it never enters a gate weight, so it needs
no gradient (DeepSeek-V3's auxiliary-loss-free balancing): after each step
``bias_i += rate * sign(mean_load - load_i)``.

Auxiliary load-balancing loss: ``coeff * E * sum_i f_i * P_i`` with ``f_i``
the fraction of the T*k assignments that chose expert i (before dropping)
and ``P_i`` the mean over tokens of the normalised score of expert i. It is
``coeff`` exactly when routing is uniform.

Capacity: ``ceil(k * T / E * capacity_factor)`` assignments per expert per
group of T tokens (a group is one rank's tokens in expert parallelism). The
overflow is dropped (its gate weight is zeroed: the token's residual carries
it) by ``position`` (earlier tokens first, as Megatron-LM's ``position``
policy) or by ``probability`` (the highest gate weights first; ties by
position); drop policy ``none`` is dropless.

Shape suffixes: T tokens, H hidden, E experts, K top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from parlab.errors import UsageError

GATINGS = ("softmax", "sigmoid")
DROP_POLICIES = ("position", "probability", "none")


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """How tokens choose experts."""

    num_experts: int
    """E: experts in the layer."""
    top_k: int
    """K: experts per token."""
    gating: str = "softmax"
    """``softmax`` or ``sigmoid`` (DeepSeek-V3)."""
    capacity_factor: float | None = None
    """Capacity = ceil(k*T/E * factor) per expert per group; None with policy ``none``."""
    drop_policy: str = "none"
    """What overflows capacity: ``position``, ``probability``, or ``none`` (dropless)."""
    aux_loss_coeff: float = 0.0
    """Coefficient of the auxiliary load-balancing loss (0 = off)."""
    bias_update_rate: float = 0.0
    """Aux-loss-free balancing step (DeepSeek-V3's gamma; 0 = off)."""
    normalize_weights: bool | None = None
    """Renormalise the k gate weights to sum 1 (default: on for sigmoid, off for softmax)."""

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise UsageError(f"--experts {self.num_experts} must be at least 1")
        if not 1 <= self.top_k <= self.num_experts:
            raise UsageError(
                f"--topk {self.top_k} must be between 1 and the {self.num_experts} experts: "
                "lower --topk or add experts"
            )
        if self.gating not in GATINGS:
            raise UsageError(f"gating {self.gating!r} is not one of {', '.join(GATINGS)}")
        if self.drop_policy not in DROP_POLICIES:
            raise UsageError(
                f"drop policy {self.drop_policy!r} is not one of {', '.join(DROP_POLICIES)}"
            )
        if self.drop_policy != "none" and (
            self.capacity_factor is None or not self.capacity_factor > 0
        ):
            raise UsageError(
                f"capacity factor {self.capacity_factor} must be above 0 when dropping by "
                f"{self.drop_policy}: give a positive --capacity-factor or --drop none (dropless)"
            )
        if self.aux_loss_coeff < 0 or self.bias_update_rate < 0:
            raise UsageError("aux loss coefficient and bias update rate must be 0 or more")

    @property
    def normalize(self) -> bool:
        if self.normalize_weights is not None:
            return self.normalize_weights
        return self.gating == "sigmoid"

    def capacity(self, tokens: int) -> int | None:
        """Assignments each expert accepts from a group of ``tokens`` (None: dropless)."""
        if self.drop_policy == "none":
            return None
        assert self.capacity_factor is not None
        return capacity(tokens, self.num_experts, self.top_k, self.capacity_factor)


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """``ceil(k * T / E * capacity_factor)``, immune to float noise (1.2 * 10 / 4 is 3, not 4)."""
    return math.ceil(round(top_k * tokens * capacity_factor / num_experts, 9))


@dataclass(frozen=True)
class Routing:
    """What the router decided for one group of tokens."""

    expert_idx_TK: torch.Tensor
    """Chosen expert of each token's k slots (int64)."""
    weight_TK: torch.Tensor
    """Gate weight of each slot (differentiable; 0 where dropped)."""
    keep_TK: torch.Tensor
    """False where the assignment overflowed capacity and was dropped."""
    scores_TE: torch.Tensor
    """Normalised scores (softmax probabilities, or sigmoid affinities / their sum)."""
    aux_loss: torch.Tensor
    """The auxiliary load-balancing loss (0 when its coefficient is 0)."""
    capacity: int | None
    """Assignments accepted per expert (None: dropless)."""

    def counts(self, num_experts: int, *, kept: bool = False) -> torch.Tensor:
        """Assignments per expert [E] (all routed, or only those kept)."""
        idx = self.expert_idx_TK[self.keep_TK] if kept else self.expert_idx_TK.reshape(-1)
        return torch.bincount(idx, minlength=num_experts)

    def unserved_tokens(self) -> int:
        """Tokens none of whose k assignments survived capacity."""
        return int((~self.keep_TK.any(dim=1)).sum())


def keep_mask(
    expert_idx_TK: torch.Tensor,
    weight_TK: torch.Tensor,
    num_experts: int,
    cap: int | None,
    policy: str,
) -> torch.Tensor:
    """Which assignments fit in ``cap`` per expert under ``policy`` (see module docstring)."""
    if policy == "none" or cap is None:
        return torch.ones_like(expert_idx_TK, dtype=torch.bool)
    T = expert_idx_TK.shape[0]
    routed_TE = torch.zeros(T, num_experts, dtype=torch.bool, device=expert_idx_TK.device)
    routed_TE.scatter_(1, expert_idx_TK, True)
    if policy == "position":
        rank_TE = torch.cumsum(routed_TE.long(), dim=0) - 1
    elif policy == "probability":
        w_TE = torch.full((T, num_experts), -math.inf, device=weight_TK.device)
        w_TE.scatter_(1, expert_idx_TK, weight_TK.detach().float())
        order_TE = torch.sort(-w_TE, dim=0, stable=True).indices
        rank_TE = torch.empty_like(order_TE)
        arange_TE = torch.arange(T, device=order_TE.device).unsqueeze(1).expand(T, num_experts)
        rank_TE.scatter_(0, order_TE, arange_TE)
    else:
        raise UsageError(f"drop policy {policy!r} is not one of {', '.join(DROP_POLICIES)}")
    keep_TE = routed_TE & (rank_TE < cap)
    return torch.gather(keep_TE, 1, expert_idx_TK)


def aux_loss(
    scores_TE: torch.Tensor, expert_idx_TK: torch.Tensor, num_experts: int, coeff: float
) -> torch.Tensor:
    """``coeff * E * sum_i f_i * P_i`` (f: fraction of assignments, P: mean score)."""
    if coeff == 0:
        return scores_TE.new_zeros(())
    T, K = expert_idx_TK.shape
    f_E = torch.bincount(expert_idx_TK.reshape(-1), minlength=num_experts).float() / (T * K)
    P_E = scores_TE.float().mean(dim=0)
    return coeff * num_experts * torch.sum(f_E * P_E)


def load_stats(counts: list[float] | torch.Tensor) -> dict[str, float]:
    """max/mean and MaxVio = (max - mean) / mean of a load vector (per expert or per rank)."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    mean = float(c.mean()) if c.numel() else 0.0
    mx = float(c.max()) if c.numel() else 0.0
    if mean == 0:
        return {"max": mx, "mean": mean, "max_over_mean": 0.0, "max_vio": 0.0}
    return {"max": mx, "mean": mean, "max_over_mean": mx / mean, "max_vio": (mx - mean) / mean}


class Router(nn.Module):
    """The gate: ``x_TH -> Routing``. Its weight is replicated on every rank."""

    def __init__(self, hidden: int, config: RouterConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(hidden, config.num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(config.num_experts), persistent=True)

    @torch.no_grad()
    def reset(self, seed: int) -> None:
        """Gate weights ~ N(0, 1/H) from a generator seeded by ``seed`` (same on every rank)."""
        w = self.gate.weight
        g = torch.Generator(device=w.device).manual_seed(seed)
        r = torch.randn(w.shape, generator=g, device=w.device, dtype=torch.float32)
        w.copy_(r / w.shape[1] ** 0.5)
        self.expert_bias.zero_()

    def forward(self, x_TH: torch.Tensor, forced_idx_TK: torch.Tensor | None = None) -> Routing:
        """Route a group of tokens; ``forced_idx_TK`` replaces the selection (skew workloads)."""
        cfg = self.config
        logits_TE = self.gate(x_TH).float()
        if cfg.gating == "softmax":
            raw_TE = torch.softmax(logits_TE, dim=-1)
            scores_TE = raw_TE
        else:
            raw_TE = torch.sigmoid(logits_TE)
            scores_TE = raw_TE / raw_TE.sum(dim=-1, keepdim=True)
        if forced_idx_TK is None:
            select_TE = raw_TE.detach() + self.expert_bias
            idx_TK = torch.topk(select_TE, cfg.top_k, dim=-1).indices
        else:
            idx_TK = forced_idx_TK.to(device=x_TH.device, dtype=torch.long)
        weight_TK = torch.gather(raw_TE, 1, idx_TK)
        if cfg.normalize:
            weight_TK = weight_TK / weight_TK.sum(dim=-1, keepdim=True)
        cap = cfg.capacity(x_TH.shape[0])
        keep_TK = keep_mask(idx_TK, weight_TK, cfg.num_experts, cap, cfg.drop_policy)
        weight_TK = weight_TK * keep_TK
        return Routing(
            expert_idx_TK=idx_TK,
            weight_TK=weight_TK.to(x_TH.dtype),
            keep_TK=keep_TK,
            scores_TE=scores_TE,
            aux_loss=aux_loss(scores_TE, idx_TK, cfg.num_experts, cfg.aux_loss_coeff),
            capacity=cap,
        )

    @torch.no_grad()
    def update_bias(self, load_E: torch.Tensor) -> None:
        """Aux-loss-free balancing: push selection away from overloaded experts.

        ``load_E`` must be the *global* load (all-reduced over the ranks that
        share this router), so every replica's bias stays identical.
        """
        rate = self.config.bias_update_rate
        if rate == 0:
            return
        load = load_E.to(self.expert_bias.device, torch.float32)
        self.expert_bias += rate * torch.sign(load.mean() - load)


def zipf_probabilities(num_experts: int, s: float) -> torch.Tensor:
    """P(expert i) proportional to 1 / (i + 1)^s: expert 0 is the hottest (s = 0: uniform)."""
    ranks = torch.arange(1, num_experts + 1, dtype=torch.float64)
    p = ranks.pow(-float(s))
    return (p / p.sum()).float()


def sample_experts(
    tokens: int, num_experts: int, top_k: int, probs_E: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Draw k distinct experts per token from ``probs_E`` (a skewed routing workload) [T, K]."""
    p = probs_E.to(torch.float32).expand(tokens, num_experts)
    return torch.multinomial(p, top_k, replacement=False, generator=generator)
