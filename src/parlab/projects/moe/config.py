"""One ``parlab project moe`` run's configuration, checked before anything launches."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from parlab.errors import UsageError
from parlab.models.router import DROP_POLICIES, GATINGS, RouterConfig
from parlab.parallel.expert import check_ep

PROJECT = "PAR-MOE-EXPERT"
BALANCE_MODES = ("none", "aux", "bias")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class MoERunConfig:
    """One ``parlab project moe`` run."""

    ep: int
    """Expert-parallel degree (ranks)."""
    experts: int
    """E: routed experts."""
    topk: int
    """k: experts per token."""
    capacity_factor: float | None = 1.25
    """Capacity factor of the measured runs (None with drop ``none``)."""
    drop: str = "position"
    """Overflow policy: ``position``, ``probability`` or ``none`` (dropless)."""
    gating: str = "softmax"
    """``softmax`` or ``sigmoid``."""
    hidden: int = 256
    """H: model width."""
    ffn_hidden: int = 512
    """F: expert FFN width."""
    tokens: int = 2048
    """Tokens per rank per forward."""
    skews: tuple[float, ...] = (1.2,)
    """Zipf exponents of the skewed workloads (uniform always runs)."""
    hot: str = "contiguous"
    """Where the hot experts sit: ``contiguous`` (Zipf rank j is expert j: rank 0 holds the
    hottest) or ``spread`` (Zipf ranks dealt round-robin over the ep ranks)."""
    sweep: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    """Capacity factors of the overflow sweep."""
    train_steps: int = 8
    """Training steps of the learned-routing workload per balancing mode (0: skip)."""
    balance: tuple[str, ...] = BALANCE_MODES
    """Balancing modes of the learned-routing workload."""
    train_lr: float = 1e-2
    """Adam learning rate of the learned-routing workload."""
    aux_coeff: float = 0.01
    """Auxiliary-loss coefficient (balance ``aux``)."""
    bias_rate: float = 0.01
    """Bias update rate (balance ``bias``)."""
    dtype: str = "auto"
    """``bf16``, ``fp32``, or ``auto`` (bf16 on GPUs, fp32 on CPU)."""
    warmup: int = 2
    """Untimed forwards per workload."""
    iters: int = 5
    """Timed forwards per workload (the median is reported)."""
    naive: bool = True
    """Also time the naive (all-gather) path."""
    seed: int = 0
    """Seed of weights, tokens and routing draws."""
    backend: str = "auto"
    """``auto``, ``nccl`` or ``gloo``."""
    timeout_s: float = 300.0
    """Process-group timeout."""

    def __post_init__(self) -> None:
        if self.ep < 1:
            raise UsageError(f"--ep {self.ep} must be at least 1")
        check_ep(self.experts, self.ep)
        if self.drop not in DROP_POLICIES:
            raise UsageError(f"--drop {self.drop!r} is not one of {', '.join(DROP_POLICIES)}")
        if self.gating not in GATINGS:
            raise UsageError(f"--gating {self.gating!r} is not one of {', '.join(GATINGS)}")
        self.router_config()  # top-k and capacity-factor checks
        for name in ("hidden", "ffn_hidden", "tokens", "iters"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1"
                )
        if self.warmup < 0 or self.train_steps < 0:
            raise UsageError("--warmup and --train-steps must be 0 or more")
        if any(s < 0 for s in self.skews):
            raise UsageError("a Zipf exponent must be 0 or more (zipf:0 is uniform)")
        if any(not cf > 0 for cf in self.sweep):
            raise UsageError("every capacity factor of --sweep must be above 0")
        bad = [b for b in self.balance if b not in BALANCE_MODES]
        if bad:
            raise UsageError(f"--balance {bad[0]!r} is not one of {', '.join(BALANCE_MODES)}")
        if self.hot not in ("contiguous", "spread"):
            raise UsageError(f"--hot {self.hot!r} is not one of contiguous, spread")
        if self.dtype not in ("auto", *DTYPES):
            raise UsageError(f"--dtype {self.dtype!r} is not one of auto, bf16, fp32")

    def router_config(self, **over: Any) -> RouterConfig:
        kw: dict[str, Any] = {
            "num_experts": self.experts,
            "top_k": self.topk,
            "gating": self.gating,
            "capacity_factor": self.capacity_factor if self.drop != "none" else None,
            "drop_policy": self.drop,
        }
        kw.update(over)
        return RouterConfig(**kw)

    def to_json(self) -> dict[str, Any]:
        """The config as JSON (tuples as lists), what a rank function receives."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MoERunConfig:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def workloads(self) -> list[tuple[str, float]]:
        return [("uniform", 0.0)] + [(f"zipf:{s:g}", s) for s in self.skews]


def parse_skews(texts: list[str] | None) -> tuple[float, ...]:
    """``["zipf:1.2", "zipf:0.8,zipf:2"]`` -> (1.2, 0.8, 2.0)."""
    out: list[float] = []
    for text in texts or []:
        for part in text.split(","):
            kind, _, value = part.strip().partition(":")
            if kind != "zipf" or not value:
                raise UsageError(
                    f"--skew {part!r}: write zipf:S with S a Zipf exponent, e.g. zipf:1.2"
                )
            try:
                out.append(float(value))
            except ValueError:
                raise UsageError(f"--skew {part!r}: {value!r} is not a number") from None
    return tuple(out)


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{what} {text!r}: give numbers separated by commas") from None
