"""What ``parlab plan`` is asked and what it answers: the request, one verdict per candidate,
and the result (every verdict, ranked, and the Pareto front)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from parlab.errors import UsageError
from parlab.ledger import Implementation
from parlab.models.spec import ModelSpec
from parlab.plan.compute import ComputeModel
from parlab.plan.estimate import StepEstimate
from parlab.plan.roofline import PRODUCTION
from parlab.plan.space import (
    DEFAULT_MICRO_BATCHES,
    DEFAULT_SCHEDULES,
    RECOMPUTE,
    SCHEDULES,
    STRATEGIES,
    Candidate,
    Cluster,
)
from parlab.plan.throughput import Throughput

CP_MIN_TOKENS = 8192
"""Context parallelism is searched only where each rank keeps at least this many tokens of a
sequence, as Llama 3 ran it (CP 16 only for its 131,072-token stage: 8,192 tokens a rank; its
8,192-token stages without CP): below it the ring's blocks are small for their K/V exchange to
hide under their attention, and a sequence that short does not need its activations split. A
``--layout`` with a smaller share is still evaluated."""


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan for."""

    spec: ModelSpec
    """The model."""
    cluster: Cluster
    """The GPUs."""
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    seq: int
    """Tokens per sequence."""
    compute: ComputeModel | Throughput
    """How compute time is priced: a compute model (efficiencies per step shape) or one MFU."""
    micro_batches: tuple[int, ...] = DEFAULT_MICRO_BATCHES
    """Micro-batch sizes to try."""
    strategies: tuple[str, ...] = STRATEGIES
    """Data-parallel strategies to try."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Recompute modes to try."""
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    """Pipeline schedules to try (when pp > 1)."""
    dtype: str = "bf16-params"
    """The ledger's dtype policy (default: bf16 parameters and gradients, float32 master weights
    and optimizer states, as Megatron's distributed optimizer and Llama 3 keep them)."""
    optimizer: str = "adamw-fused"
    """The ledger's optimizer (default: fused AdamW, no temporaries)."""
    overlap: float = 1.0
    """Fraction of each window's compute that non-blocking communication can hide behind."""
    memory_reserve: float = 0.0
    """Fraction of GPU memory kept free (CUDA context, fragmentation)."""
    max_exposed_comm: float | None = None
    """Reject candidates whose exposed communication exceeds this fraction of the step."""
    implementation: Implementation = PRODUCTION
    """The kernels the memory, the elementwise bytes and the attention core are counted for
    (default: production's, ``parlab.plan.roofline.PRODUCTION``)."""
    cp_min_tokens: int = CP_MIN_TOKENS
    """The search's context-parallel rule (``CP_MIN_TOKENS``)."""

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.seq < 1:
            raise UsageError(
                f"global batch {self.global_batch}, sequence {self.seq}: give positive sizes"
            )
        if self.spec.position == "learned" and self.seq > self.spec.max_seq_len:
            raise UsageError(
                f"sequence {self.seq} exceeds {self.spec.name}'s {self.spec.max_seq_len} learned "
                "positions: plan a shorter --seq"
            )
        if not 0.0 <= self.memory_reserve < 1.0:
            raise UsageError(f"memory reserve {self.memory_reserve}: give a fraction in [0, 1)")
        if not 0.0 <= self.overlap <= 1.0:
            raise UsageError(f"overlap {self.overlap}: give a fraction in [0, 1]")
        for name, values, allowed in (
            ("strategy", self.strategies, STRATEGIES),
            ("recompute", self.recompute, RECOMPUTE),
            ("schedule", self.schedules, SCHEDULES),
        ):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise UsageError(
                    f"{name} {', '.join(bad) or '(none)'}: use one or more of {', '.join(allowed)}"
                )
        if not self.micro_batches or any(m < 1 for m in self.micro_batches):
            raise UsageError(f"micro-batches {self.micro_batches}: give sizes of at least 1")

    @property
    def usable_memory(self) -> float:
        return self.cluster.gpu.memory_bytes * (1.0 - self.memory_reserve)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    @property
    def peak_flops(self) -> float:
        return float(self.cluster.gpu.peak("bf16") or 0.0)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One candidate, admitted or rejected."""

    cand: Candidate
    """The candidate."""
    admitted: bool
    """Whether it passed every check."""
    kind: str = ""
    """Why rejected: ``layout``, ``batch``, ``unsupported``, ``memory``, ``comm``."""
    reason: str = ""
    """One line: the check and its numbers."""
    peak_bytes: float | None = None
    """Predicted peak per rank (the floor, for a group rejected on its states)."""
    estimate: StepEstimate | None = None
    """The step-time estimate (admitted, or rejected for memory or comm)."""
    tokens_per_s_per_gpu: float | None = None
    """Predicted throughput."""
    mfu: float | None = None
    """Predicted MFU (model FLOPs, recompute not counted, over the dense bf16 peak)."""
    headroom_bytes: float | None = None
    """Usable memory minus peak."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.cand.to_json(), "admitted": self.admitted}
        if not self.admitted:
            out["kind"] = self.kind
            out["reason"] = self.reason
        out["peak_bytes"] = self.peak_bytes
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_json()
            out["tokens_per_s_per_gpu"] = self.tokens_per_s_per_gpu
            out["mfu"] = self.mfu
            out["headroom_bytes"] = self.headroom_bytes
        return out


@dataclass(kw_only=True)
class PlanResult:
    """Every verdict, ranked, and the front."""

    request: PlanRequest
    """What was planned."""
    ranked: list[Verdict]
    """Admitted candidates, best first."""
    rejected: list[Verdict]
    """Rejected candidates, in search order."""
    pareto: list[Verdict]
    """Admitted candidates no other beats on both throughput and memory (fastest first)."""
    flops_per_token: float
    """Training FLOPs per token, no recompute."""
    elapsed_s: float
    """Search wall time."""
    ledger_calls: int = 0
    """How many times the ledger was asked."""
    notes: list[str] = field(default_factory=list)
    """Assumptions."""

    @property
    def top(self) -> Verdict | None:
        return self.ranked[0] if self.ranked else None

    def rejected_by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.rejected))
