"""The engine's knobs (``EngineConfig``) and one request inside it (``Sequence``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parlab.errors import UsageError

DEFAULT_GRAPH_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
"""Batch sizes a decode step is captured at (vLLM's buckets: 1, 2, 4, then multiples of 8,
thinned out past 32); a step of ``b`` sequences replays the smallest bucket that holds it."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one engine schedules and what it holds."""

    max_batch: int = 16
    """Most sequences running at once (vLLM's ``max_num_seqs``)."""
    max_len: int = 2048
    """Longest prompt + output, tokens (``max_model_len``)."""
    block: int = 16
    """KV-cache page, tokens; also the prefix cache's block (its chained hashes)."""
    prefix_cache: bool = True
    """Share the pages of cached prompt prefixes between requests (by reference)."""
    cache_blocks: int = 4096
    """Pages beyond what ``max_batch`` sequences at ``max_len`` need: room the prefix cache
    always has (cached pages also live in any page no running sequence holds)."""
    max_step_tokens: int = 2048
    """Most tokens one step computes: one per decoding sequence, the rest prefill chunks
    (vLLM's ``max_num_batched_tokens``); a longer prompt is prefilled over several steps."""
    cuda_graphs: bool | None = None
    """Replay decode-only steps from CUDA graphs, one per batch bucket. None: on where the
    device is CUDA, the engine is not tensor parallel and the model has no MoE layer (its
    dropless routing has data-dependent shapes); True: required (``UsageError`` where it
    cannot be); False: eager."""
    graph_batches: tuple[int, ...] = DEFAULT_GRAPH_BATCHES
    """Decode batch buckets captured (those up to ``max_batch``, and ``max_batch``)."""
    attention: str = "auto"
    """Paged attention kernel: ``triton`` (CUDA), ``torch`` (SDPA over gathered pages), or
    ``auto`` (triton on CUDA where Triton imports, else torch)."""

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_len < 2:
            raise UsageError(
                f"--max-batch {self.max_batch} and --max-len {self.max_len} must be >= 1, 2"
            )
        if self.block < 1 or self.cache_blocks < 0:
            raise UsageError("the KV page (block) must be >= 1 token and --cache-blocks >= 0")
        if self.max_step_tokens < self.max_batch:
            raise UsageError(
                f"--max-step-tokens {self.max_step_tokens} is below --max-batch {self.max_batch}: "
                "a step must hold one token of every running sequence"
            )
        if self.attention not in ("auto", "triton", "torch"):
            raise UsageError(f"attention {self.attention!r} is not one of auto, triton, torch")
        if not self.graph_batches or min(self.graph_batches) < 1:
            raise UsageError(f"graph batches {self.graph_batches} must be positive")

    @property
    def blocks_per_seq(self) -> int:
        """Pages one sequence of ``max_len`` tokens holds."""
        return -(-self.max_len // self.block)

    @property
    def num_blocks(self) -> int:
        """Pages in the pool: a full batch at ``max_len``, ``cache_blocks``, and page 0 (the
        null page padding rows write to)."""
        return self.max_batch * self.blocks_per_seq + self.cache_blocks + 1

    def buckets(self) -> list[int]:
        """The decode batch buckets captured, ascending, the last ``max_batch``."""
        return sorted({b for b in self.graph_batches if b < self.max_batch} | {self.max_batch})


@dataclass(eq=False)
class Sequence:
    """One request (one choice) inside the engine."""

    prompt: list[int]
    """Prompt token ids."""
    max_tokens: int
    """Tokens to generate at most."""
    temperature: float = 0.0
    """0: greedy."""
    top_p: float = 1.0
    """Nucleus mass (1: off)."""
    seed: int | None = None
    """Sampling seed (None: one drawn when the engine takes it)."""
    ignore_eos: bool = False
    """Keep generating past the tokenizer's stop ids (else one ends it: ``stop``)."""
    output: list[int] = field(default_factory=list)
    """Generated token ids (a stop id that ended it included)."""
    cached_tokens: int = 0
    """Prompt tokens whose pages came from the prefix cache."""
    computed: int = 0
    """Prompt tokens whose K/V are in its pages."""
    blocks: list[int] = field(default_factory=list)
    """Its pages, in order (the first ``cached_tokens // block`` shared)."""
    hashes: list[int] = field(default_factory=list)
    """Chained hashes of its prompt's full blocks (prefix cache)."""
    registered: int = 0
    """Prompt blocks already entered in the prefix cache."""
    row: int = -1
    """Its row of the engine's block table while running."""
    finish_reason: str | None = None
    """``stop``, ``length``, ``cancelled`` or ``error`` once finished."""
    sink: Any = None
    """Where its tokens go (the server's queue)."""
    cancelled: bool = False
    uid: int = -1
    """Engine-wide id (the same on every tensor-parallel rank)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def length(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt) + len(self.output)

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)
