"""One engine step's inputs as flat arrays (tokens, positions, KV slots, page table, the
sampling knobs), and the padding a captured decode step is replayed with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parlab.serve.engine.config import EngineConfig

_INT_FIELDS = ("tokens", "positions", "slots", "lens", "seed", "step", "eos_ok", "rows")
_FLOAT_FIELDS = ("temperature", "top_p")


@dataclass
class StepInputs:
    """A step's inputs on the host (numpy)."""

    tokens: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    n_decode: int
    table: np.ndarray
    """``[n_decode, pages]`` page table of the decoding rows."""
    lens: np.ndarray
    chunks: list[tuple[int, int, int, np.ndarray]]
    """``(offset, n, start, pages)`` per prompt chunk."""
    rows: np.ndarray
    """Tokens whose logits are sampled (every decode token, each last prompt chunk's last)."""
    temperature: np.ndarray
    top_p: np.ndarray
    seed: np.ndarray
    step: np.ndarray
    eos_ok: np.ndarray

    def pack(self) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, int]]]:
        """Every int array (the page table last) in one int64 buffer, the floats in one
        float32 buffer, and where each field sits."""
        ints = [getattr(self, f).astype(np.int64, copy=False).ravel() for f in _INT_FIELDS]
        ints.append(self.table.astype(np.int64, copy=False).ravel())
        ints += [c[3].astype(np.int64, copy=False) for c in self.chunks]
        where: dict[str, tuple[int, int]] = {}
        o = 0
        names = [*_INT_FIELDS, "table", *(f"c{i}" for i in range(len(self.chunks)))]
        for name, a in zip(names, ints, strict=True):
            where[name] = (o, o + a.size)
            o += a.size
        floats = np.concatenate([getattr(self, f).astype(np.float32) for f in _FLOAT_FIELDS])
        return np.concatenate(ints), floats, where


def empty_decode(cfg: EngineConfig) -> StepInputs:
    """A decode step of no sequence (padded by ``pad_decode``)."""
    z = np.zeros(0, dtype=np.int64)
    f = np.zeros(0, dtype=np.float32)
    return StepInputs(
        tokens=z, positions=z, slots=z, n_decode=0,
        table=np.zeros((0, cfg.blocks_per_seq), dtype=np.int64), lens=z, chunks=[], rows=z,
        temperature=f, top_p=f, seed=z, step=z, eos_ok=z,
    )  # fmt: skip


def pad_decode(inp: StepInputs, bucket: int) -> StepInputs:
    """A decode-only step padded to ``bucket`` rows: token 0 at position 0 of page 0, one
    key, greedy; the page table at its full width (the captured shape)."""
    pad = bucket - inp.n_decode

    def z(a: np.ndarray, fill: float = 0) -> np.ndarray:
        return np.concatenate([a, np.full(pad, fill, dtype=a.dtype)])

    M = inp.table.shape[1]
    full = np.zeros((bucket, max(M, 1)), dtype=np.int64)
    full[: inp.n_decode, :M] = inp.table
    return StepInputs(
        tokens=z(inp.tokens), positions=z(inp.positions), slots=z(inp.slots), n_decode=bucket,
        table=full, lens=z(inp.lens, 1), chunks=[], rows=np.arange(bucket, dtype=np.int64),
        temperature=z(inp.temperature), top_p=z(inp.top_p, 1.0), seed=z(inp.seed),
        step=z(inp.step), eos_ok=z(inp.eos_ok),
    )  # fmt: skip
