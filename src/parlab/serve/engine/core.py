"""``Engine``: continuous batching of one model over a paged KV cache.

``step()`` runs one iteration: the scheduler (``scheduler.py``) picks every decoding
sequence's next token and prompt chunks up to the token budget; the runner (``runner.py``)
computes them in one forward (a replayed CUDA graph for decode-only steps where graphs are
on) and samples on the device; the new tokens join their sequences, which finish on a stop id
(``finish_reason`` ``stop``, unless ``ignore_eos``) or at ``max_tokens`` / the context
(``length``). Every step is logged (``Engine.log``).

Tensor parallelism (``tp``, ``parlab.serve.tp``): rank 0 broadcasts the requests submitted
and cancelled since the last step, so every rank schedules the same step; sampling hashes
each request's seed, so every rank draws the same tokens from the same logits.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

from parlab.errors import UsageError
from parlab.serve.engine.config import EngineConfig, Sequence
from parlab.serve.engine.runner import ModelRunner, StepInputs
from parlab.serve.engine.scheduler import Scheduler, StepPlan
from parlab.serve.tokenizer import Tokenizer, get


class Engine:
    """Continuous batching for one model on one device (or one tensor-parallel rank)."""

    def __init__(
        self,
        model: Any,
        config: EngineConfig | None = None,
        tp: Any = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        spec = model.spec
        if spec.mla is not None:
            raise UsageError(f"model {spec.name!r} uses MLA: the reference replica serves MHA/GQA")
        self.tokenizer = tok = tokenizer or get()
        if spec.vocab_size < tok.vocab_size:
            raise UsageError(
                f"model {spec.name!r} has vocab {spec.vocab_size} < the tokenizer's "
                f"{tok.vocab_size}: build it with parlab.serve.replica.serving_spec"
            )
        self.config = cfg = config or EngineConfig()
        if spec.position == "learned" and cfg.max_len > spec.max_seq_len:
            raise UsageError(
                f"--max-len {cfg.max_len} exceeds {spec.name}'s {spec.max_seq_len} learned positions"
            )
        self.model = model.eval()
        self.tp = tp
        self.sched = Scheduler(cfg)
        self.runner = ModelRunner(model, cfg, allowed=tok.sampleable, stop_ids=tok.stop_ids, tp=tp)
        n = cfg.max_batch
        self._temperature = np.zeros(n, dtype=np.float32)
        self._top_p = np.ones(n, dtype=np.float32)
        self._seed = np.zeros(n, dtype=np.int64)
        self._eos_ok = np.zeros(n, dtype=np.int64)
        self._prompt_len = np.zeros(n, dtype=np.int64)
        self._max_tokens = np.zeros(n, dtype=np.int64)
        self._stop_ids = np.asarray(tok.stop_ids, dtype=np.int64)
        self.log: list[dict[str, float]] = []
        """Per step: ``kind`` (0: it held prompt chunks, 1: decode only), ``batch``
        (sequences), ``decode`` (decoding sequences), ``tokens`` (computed), ``prefill``
        (prompt tokens computed), ``admitted`` (requests that joined) and ``cached`` (their
        prompt tokens from the prefix cache), ``context`` (tokens attended to), ``s``
        (seconds), ``cpu`` (this thread's CPU seconds in it), ``graph`` (the decode bucket
        replayed, 0: eager)."""
        self._inbox: list[Sequence] = []
        self._cancels: list[int] = []
        self._next_uid = 0
        self._by_uid: dict[int, Sequence] = {}
        self._plan: StepPlan | None = None
        self._cancelled = False

    @property
    def device(self) -> Any:
        return self.runner.device

    @property
    def capture_s(self) -> float:
        """Seconds the start-up graph capture took."""
        return self.runner.capture_s

    # -- requests ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; ``UsageError`` if it cannot fit."""
        if not seq.prompt:
            raise UsageError("empty prompt: give at least one token")
        if len(seq.prompt) + max(seq.max_tokens, 1) > self.config.max_len:
            raise UsageError(
                f"prompt ({len(seq.prompt)} tokens) + max_tokens ({seq.max_tokens}) exceeds "
                f"the replica's --max-len {self.config.max_len}"
            )
        if max(seq.prompt) >= self.model.spec.vocab_size or min(seq.prompt) < 0:
            raise UsageError(f"a prompt token id is outside 0..{self.model.spec.vocab_size - 1}")
        self.submit(seq)

    def submit(self, seq: Sequence) -> None:
        """Hand a request to the engine; it joins at the start of the next ``step``."""
        if seq.seed is None:
            seq.seed = random.getrandbits(63)
        self._inbox.append(seq)

    def cancel(self, seq: Sequence) -> None:
        """Drop a request at the start of the next ``step``."""
        self._cancels.append(seq.uid)

    def has_work(self) -> bool:
        return bool(self.sched.has_work() or self._inbox or self._cancels)

    def reset_cache(self) -> None:
        """Empty the prefix cache and the log (between experiments)."""
        self.sched.pool.clear()
        self.log.clear()

    def _admit_inbox(self) -> None:
        """Move submitted requests and cancellations in; on tensor-parallel ranks rank 0
        broadcasts them first."""
        new, self._inbox = self._inbox, []
        cancels, self._cancels = self._cancels, []
        if self.tp is not None:
            fields = ("prompt", "max_tokens", "temperature", "top_p", "seed", "ignore_eos")
            msg = [tuple(getattr(s, f) for f in fields) for s in new]
            msg, cancels = self.tp.broadcast_plan((msg, cancels))
            if not self.tp.is_main:
                new = [Sequence(**dict(zip(fields, m, strict=True))) for m in msg]
        for seq in new:
            seq.uid = self._next_uid
            self._next_uid += 1
            self._by_uid[seq.uid] = seq
            self.sched.waiting.append(seq)
        for uid in cancels:
            if uid in self._by_uid:
                self._by_uid[uid].cancelled = True
                self._cancelled = True

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        self._cancelled = False
        for s in [s for s in self.sched.running if s.cancelled]:
            self._finish(s, "cancelled")
        if any(s.cancelled for s in self.sched.waiting):
            for s in [s for s in self.sched.waiting if s.cancelled]:
                self.sched.waiting.remove(s)
                s.finish_reason = "cancelled"
                self._by_uid.pop(s.uid, None)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.sched.release(seq)
        self._by_uid.pop(seq.uid, None)

    # -- one step ----------------------------------------------------------------------------
    def _inputs(self, plan: StepPlan) -> StepInputs:
        """The step's inputs, built with numpy over the running rows."""
        s, bs = self.sched, self.config.block
        rows = plan.rows
        L = s.length[rows]  # their new token included: its K/V go to position L - 1
        pos = L - 1
        toks, posl, slots = [s.last[rows]], [pos], [s.table[rows, pos // bs] * bs + pos % bs]
        chunks, last_rows = [], []
        off = len(rows)
        for c in plan.chunks:
            seq = c.seq
            p = np.arange(c.start, c.start + c.n)
            toks.append(np.asarray(seq.prompt[c.start : c.start + c.n], dtype=np.int64))
            posl.append(p)
            slots.append(s.table[seq.row, p // bs] * bs + p % bs)
            chunks.append((off, c.n, c.start, s.table[seq.row, : -(-(c.start + c.n) // bs)]))
            off += c.n
            if c.last:
                last_rows.append(off - 1)
        sample_rows = plan.sample_rows
        steps = np.concatenate([L - self._prompt_len[rows], np.zeros(len(last_rows), np.int64)])
        return StepInputs(
            tokens=np.concatenate(toks),
            positions=np.concatenate(posl),
            slots=np.concatenate(slots),
            n_decode=len(rows),
            table=s.table[rows],
            lens=L,
            chunks=chunks,
            rows=np.concatenate([np.arange(len(rows)), np.asarray(last_rows, dtype=np.int64)]),
            temperature=self._temperature[sample_rows],
            top_p=self._top_p[sample_rows],
            seed=self._seed[sample_rows],
            step=steps,
            eos_ok=self._eos_ok[sample_rows],
        )

    def step(self) -> list[Sequence]:
        """Run one iteration; return the sequences that got a token (the caller reads
        ``seq.output[-1]``; finished ones are already out of the engine)."""
        self._admit_inbox()
        self._drop_cancelled()
        t0, c0 = time.perf_counter(), time.thread_time()
        plan = self.sched.plan()
        if not plan.tokens:
            return []
        self._plan = plan
        for seq in plan.admitted:
            r = seq.row
            self._temperature[r], self._top_p[r] = seq.temperature, seq.top_p
            self._seed[r] = (seq.seed or 0) & ((1 << 63) - 1)
            self._eos_ok[r] = int(not seq.ignore_eos)
            self._prompt_len[r] = len(seq.prompt)
            self._max_tokens[r] = seq.max_tokens
        inp = self._inputs(plan)
        toks, bucket = self.runner.run(inp)
        self.sched.computed(plan)
        seqs = self._take(plan.sample_rows, toks)
        self._plan = None
        self.log.append(
            {
                "kind": 0 if plan.chunks else 1,
                "batch": len(plan.rows) + len(plan.chunks),
                "decode": len(plan.rows),
                "tokens": plan.tokens,
                "prefill": plan.tokens - len(plan.rows),
                "admitted": len(plan.admitted),
                "cached": sum(s.cached_tokens for s in plan.admitted),
                "context": int(inp.lens.sum()) + sum(c.start + c.n for c in plan.chunks),
                "s": time.perf_counter() - t0,
                "cpu": time.thread_time() - c0,
                "graph": bucket,
            }
        )
        return seqs  # type: ignore[return-value]

    def _take(self, rows: np.ndarray, toks: np.ndarray) -> list[Sequence]:
        """The step's tokens join their sequences; those a stop id (unless ``ignore_eos``)
        or their length ends finish. Vectorized but for one list append per sequence."""
        s = self.sched
        seqs = [s.seq_of[r] for r in rows]
        for seq, t in zip(seqs, toks.tolist(), strict=True):
            seq.output.append(t)  # type: ignore[union-attr]
        s.append(rows, toks)
        stop = (self._eos_ok[rows] > 0) & (toks[:, None] == self._stop_ids).any(axis=1)
        full = (s.length[rows] - self._prompt_len[rows] >= self._max_tokens[rows]) | (
            s.length[rows] >= self.config.max_len
        )
        for i in np.flatnonzero(stop | full):
            self._finish(seqs[i], "stop" if stop[i] else "length")  # type: ignore[arg-type]
        return seqs  # type: ignore[return-value]

    def fail_step(self) -> list[Sequence]:
        """After ``step`` raised: finish the sequences of the step it was running with
        ``error`` (their pages freed) and return them; the engine goes on serving."""
        plan, self._plan = self._plan, None
        if plan is None:
            return []
        seqs = [self.sched.seq_of[r] for r in plan.rows] + [c.seq for c in plan.chunks]
        out = []
        for seq in seqs:
            if seq is not None and not seq.finished:
                self._finish(seq, "error")
                out.append(seq)
        return out

    def generate(
        self, prompts: list[list[int]], max_tokens: int, **sampling: Any
    ) -> list[list[int]]:
        """Run requests to completion (offline use and tests)."""
        seqs = [Sequence(prompt=list(p), max_tokens=max_tokens, **sampling) for p in prompts]
        for s in seqs:
            self.add(s)
        guard = 0
        while self.has_work():
            self.step()
            guard += 1
            assert guard < 10_000_000
        return [s.output for s in seqs]
