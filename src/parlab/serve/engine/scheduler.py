"""Which tokens one engine step computes: every decoding sequence's next token, then chunks of
prompts up to the step's token budget (chunked prefill mixed with decode, as vLLM's and
SGLang's schedulers do).

State, kept in arrays indexed by a running sequence's ``row`` so that building a step and
taking its tokens cost a few numpy operations whatever the batch: ``table[row]`` its pages, ``length[row]`` its
tokens (prompt + output), ``last[row]`` its last token, ``decoding[row]`` whether its prompt
is done. A waiting request is admitted first come, first served, while a row is free and the
pool can give every page it may need (its prompt plus ``max_tokens``, reserved at once, so no
running sequence is ever preempted); its longest cached prefix is taken by reference (at
most ``(prompt - 1) // block`` pages: at least one prompt token is computed, for the logits
of the first output token).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from parlab.serve.engine.blocks import BlockPool
from parlab.serve.engine.config import EngineConfig, Sequence
from parlab.serve.prefix import block_hashes


@dataclass
class Chunk:
    """Prompt tokens ``start .. start + n - 1`` of ``seq``, computed in one step."""

    seq: Sequence
    start: int
    n: int

    @property
    def last(self) -> bool:
        """It ends the prompt: the step samples the first output token."""
        return self.start + self.n == len(self.seq.prompt)


@dataclass
class StepPlan:
    """One step: the decoding rows (one token each), then the prompt chunks."""

    rows: np.ndarray
    """Rows of the decoding sequences (ascending)."""
    chunks: list[Chunk] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    """Sequences that joined this step (their ``cached_tokens`` came from the cache)."""
    sample_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Rows that get a token: the decoding ones, then each chunk that ends its prompt."""

    @property
    def tokens(self) -> int:
        return len(self.rows) + sum(c.n for c in self.chunks)


class Scheduler:
    """Waiting and running sequences, their rows and pages."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.pool = BlockPool(cfg.num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        """Running sequences whose prompt is not all computed yet, in admission order."""
        self.table = np.zeros((cfg.max_batch, cfg.blocks_per_seq), dtype=np.int64)
        self.length = np.zeros(cfg.max_batch, dtype=np.int64)
        self.last = np.zeros(cfg.max_batch, dtype=np.int64)
        self.decoding = np.zeros(cfg.max_batch, dtype=bool)
        self.seq_of: list[Sequence | None] = [None] * cfg.max_batch
        self._rows = list(range(cfg.max_batch))[::-1]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _pages_for(self, seq: Sequence) -> int:
        total = min(len(seq.prompt) + seq.max_tokens, self.cfg.max_len)
        return -(-total // self.cfg.block)

    def _admit(self, seq: Sequence) -> bool:
        """Give ``seq`` a row and its pages if both are there."""
        cfg = self.cfg
        if not self._rows:
            return False
        hashes = block_hashes(seq.prompt, cfg.block) if cfg.prefix_cache else []
        hit = self.pool.match(hashes)[: (len(seq.prompt) - 1) // cfg.block]
        need = self._pages_for(seq) - len(hit)
        # an idle cached page this request hits is counted available but taken by share
        idle_hits = sum(1 for b in hit if self.pool.ref[b] == 0)
        if need > self.pool.available - idle_hits:
            return False
        self.pool.share(hit)
        seq.blocks = hit + self.pool.take(need)
        seq.hashes, seq.registered = hashes, len(hit)
        seq.cached_tokens = seq.computed = len(hit) * cfg.block
        seq.row = row = self._rows.pop()
        self.table[row, : len(seq.blocks)] = seq.blocks
        self.length[row] = len(seq.prompt)
        self.decoding[row] = False
        self.seq_of[row] = seq
        self.running.append(seq)
        self.prefilling.append(seq)
        return True

    def plan(self) -> StepPlan:
        """The next step (empty when nothing can run)."""
        rows = np.flatnonzero(self.decoding)
        budget = self.cfg.max_step_tokens - len(rows)
        plan = StepPlan(rows=rows)
        for seq in self.prefilling:
            if budget <= 0:
                break
            n = min(budget, len(seq.prompt) - seq.computed)
            plan.chunks.append(Chunk(seq, seq.computed, n))
            budget -= n
        while budget > 0 and self.waiting and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            n = min(budget, len(seq.prompt) - seq.computed)
            plan.chunks.append(Chunk(seq, seq.computed, n))
            plan.admitted.append(seq)
            budget -= n
        plan.sample_rows = np.concatenate(
            [rows, np.asarray([c.seq.row for c in plan.chunks if c.last], dtype=np.int64)]
        )
        return plan

    def computed(self, plan: StepPlan) -> None:
        """The step's K/V are written: advance the chunks and enter the prompt blocks they
        completed in the prefix cache."""
        bs = self.cfg.block
        for c in plan.chunks:
            seq = c.seq
            seq.computed = c.start + c.n
            full = min(seq.computed // bs, len(seq.hashes))
            for j in range(seq.registered, full):
                self.pool.register(seq.blocks[j], seq.hashes[j])
            seq.registered = max(seq.registered, full)
        if any(c.last for c in plan.chunks):
            self.prefilling = [s for s in self.prefilling if s.prefilling]

    def append(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """The step's sampled ``tokens`` join the sequences of ``rows`` (their K/V are
        written by the next step)."""
        self.length[rows] += 1
        self.last[rows] = tokens
        self.decoding[rows] = True

    def release(self, seq: Sequence) -> None:
        """``seq`` leaves (finished or cancelled): its pages and row go back."""
        if seq.row >= 0:
            self.running.remove(seq)
            if seq.prefilling:
                self.prefilling.remove(seq)
            self.pool.release(seq.blocks)
            self.decoding[seq.row] = False
            self.seq_of[seq.row] = None
            self._rows.append(seq.row)
            seq.row = -1
            seq.blocks = []
