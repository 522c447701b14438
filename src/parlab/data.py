"""Token data for training runs: a deterministic seeded synthetic set, or a local text file.

Both give, for step ``s``, the *global* batch of ``global_batch`` sequences of
``seq + 1`` tokens (inputs and next-token labels), the same on every rank and
in every run with the same seed; a data-parallel rank takes its contiguous
slice (``rank_batch``), so the ranks of a run together see exactly the batch a
single process trains on -- the property the mechanism tests rely on.

- ``SyntheticTokens``: uniform random tokens from ``torch.Generator`` seeded
  with ``(seed, step)``; no file, no network.
- ``TextTokens``: the bytes of a local UTF-8 file as tokens (vocabulary 256),
  windows taken at seeded random offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from parlab.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Batch:
    """Inputs and labels of one batch (token ids, int64)."""

    inputs: torch.Tensor
    """``[batch, seq]`` token ids."""
    labels: torch.Tensor
    """``[batch, seq]``: the inputs shifted by one token."""


class SyntheticTokens:
    """Uniform random tokens in ``[0, vocab)``, a pure function of (seed, step)."""

    def __init__(self, *, vocab_size: int, seq: int, seed: int = 0) -> None:
        if vocab_size < 2 or seq < 1:
            raise UsageError(f"vocab {vocab_size} / seq {seq}: need a vocabulary >= 2 and seq >= 1")
        self.vocab_size = vocab_size
        self.seq = seq
        self.seed = seed

    def describe(self) -> dict[str, object]:
        return {"kind": "synthetic", "vocab_size": self.vocab_size, "seed": self.seed}

    def global_batch(self, step: int, global_batch: int) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.randint(0, self.vocab_size, (global_batch, self.seq + 1), generator=g)
        return Batch(inputs=tokens[:, :-1], labels=tokens[:, 1:])


class TextTokens:
    """The bytes of a local text file as tokens (vocabulary 256), seeded random windows."""

    def __init__(self, path: str | Path, *, seq: int, seed: int = 0) -> None:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"data file {path} does not exist: give a local text file")
        data = path.read_bytes()
        if len(data) < seq + 2:
            raise UsageError(
                f"data file {path} has {len(data)} bytes, fewer than seq + 2 = {seq + 2}: "
                "use a longer file or a shorter --seq"
            )
        self.path = path
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
        self.seq = seq
        self.seed = seed
        self.vocab_size = 256

    def describe(self) -> dict[str, object]:
        return {"kind": "text-bytes", "path": str(self.path), "bytes": len(self.tokens)}

    def global_batch(self, step: int, global_batch: int) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (global_batch,), generator=g)
        rows = torch.stack([self.tokens[s : s + self.seq + 1] for s in starts.tolist()])
        return Batch(inputs=rows[:, :-1], labels=rows[:, 1:])


def rank_batch(batch: Batch, dp_rank: int, dp: int, device: torch.device | str = "cpu") -> Batch:
    """Data-parallel rank ``dp_rank``'s contiguous slice of the global batch."""
    n = batch.inputs.shape[0]
    assert n % dp == 0, "the caller checks that dp divides the global batch"
    per = n // dp
    sl = slice(dp_rank * per, (dp_rank + 1) * per)
    device = torch.device(device)

    def move(t: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":  # pinned: the copy does not wait for queued GPU work
            return t.contiguous().pin_memory().to(device, non_blocking=True)
        return t.to(device)

    return Batch(inputs=move(batch.inputs[sl]), labels=move(batch.labels[sl]))
