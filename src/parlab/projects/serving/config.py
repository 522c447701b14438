"""The serving project's sizes (``Preset``) and its named presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.errors import UsageError

PROJECT = "PAR-DISTRIBUTED-INFERENCE"
ALL_POLICIES = ("round_robin", "random", "least_outstanding", "power_of_two", "cache_aware")


@dataclass(frozen=True, kw_only=True)
class Preset:
    """The sizes of one project run."""

    model: str
    """Reference model name (the replicas parlab starts)."""
    devices: tuple[str, ...]
    """One reference replica per device (ignored with ``replicas``)."""
    dtype: str
    """Weights and KV dtype."""
    max_batch: int
    """Sequences running at once per replica."""
    max_len: int
    """Longest prompt + output."""
    num_prompts: int
    """Requests per policy."""
    groups: int
    """Shared-prefix groups."""
    prefix_len: int
    """Shared prefix, tokens."""
    question_len: int
    """Unique part, tokens."""
    output_len: int
    """Output tokens."""
    rate: float
    """Requests/s."""
    kv_tokens: tuple[int, ...]
    """Request lengths for the KV transfer sweep."""
    cache_blocks: int = 4096
    """Prefix-cache room per replica, 16-token pages (small: locality matters)."""
    warmup_prompts: int = 16
    """Requests of a discarded round-robin pass before the measured policies (0: none)."""
    replicas: tuple[str, ...] = ()
    """Running OpenAI-compatible replicas to measure instead of starting parlab's (their
    engine and version are asked of them: ``GET /version``, ``/v1/models``)."""

    def __post_init__(self) -> None:
        if not self.replicas and not self.devices:
            raise ValueError("a serving preset needs devices for its replicas, or --replicas")
        for name in ("max_batch", "max_len", "num_prompts", "groups", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.prefix_len < 1 or self.question_len < 1:
            raise ValueError("--prefix-len and --question-len must be >= 1 token")
        if self.prefix_len + self.question_len + self.output_len > self.max_len:
            raise ValueError(
                f"prefix {self.prefix_len} + question {self.question_len} + output "
                f"{self.output_len} tokens exceed --max-len {self.max_len}"
            )
        if not (self.rate > 0) or math.isnan(self.rate):
            raise ValueError(f"--request-rate {self.rate} must be positive")
        if not self.kv_tokens or min(self.kv_tokens) < 1:
            raise ValueError(f"KV transfer lengths {self.kv_tokens} must be positive")
        if self.cache_blocks < 0 or self.warmup_prompts < 0:
            raise ValueError("cache blocks and warm-up prompts must be >= 0")


def get_preset(name: str) -> Preset:
    """``cpu`` (the tiny model, two replicas) or ``gpu`` (1.3B, one replica per GPU)."""
    if name == "cpu":
        return Preset(
            model="tiny",
            devices=("cpu", "cpu"),
            dtype="float32",
            max_batch=8,
            max_len=1024,
            num_prompts=48,
            groups=8,
            prefix_len=384,
            question_len=32,
            output_len=16,
            rate=8.0,
            kv_tokens=(16, 64, 256, 1024),
            cache_blocks=128,
        )
    if name == "gpu":
        import torch  # lazy: torch

        n = torch.cuda.device_count()
        if n < 1:
            raise UsageError("--preset gpu needs a GPU: use --preset cpu here")
        return Preset(
            model="1.3b",
            devices=tuple(f"cuda:{i}" for i in range(n)),
            dtype="bfloat16",
            max_batch=32,
            max_len=4096,
            num_prompts=48,
            groups=16,
            prefix_len=2048,
            question_len=64,
            output_len=64,
            rate=16.0,
            kv_tokens=(16, 128, 512, 2048, 8192),
            cache_blocks=1024,
        )
    raise UsageError(f"--preset {name!r}: use cpu or gpu")
