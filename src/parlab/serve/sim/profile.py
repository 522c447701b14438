"""A replica's step costs for the simulator (``ReplicaProfile``) and their fits from a real
replica's step log: the engine's (``fit_profile``) and its serving loop's (``fit_loop``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

PROFILE_TERMS = (
    "decode_base_s",
    "prefill_base_s",
    "prefill_per_token_s",
    "prefill_per_cached_token_s",
    "decode_per_seq_s",
    "decode_per_token_s",
)
"""The step cost's coefficients, in the order of ``step_features``."""


def step_features(e: dict[str, float]) -> list[float]:
    """A logged engine step's regressors for ``PROFILE_TERMS``: 1, requests admitted, prompt
    tokens computed, prompt tokens cached, decoding requests, context tokens."""
    return [
        1.0,
        float(e.get("admitted", 0)),
        float(e.get("prefill", 0)),
        float(e.get("cached", 0)),
        float(e.get("decode", 0)),
        float(e.get("context", 0)),
    ]


@dataclass(frozen=True, kw_only=True)
class ReplicaProfile:
    """Measured step costs of one replica (``profiling.profile_engine``, ``fit_profile``)."""

    prefill_base_s: float
    """Cost of admitting one request."""
    prefill_per_token_s: float
    """Cost per uncached prompt token computed."""
    decode_base_s: float
    """Fixed cost of a step."""
    decode_per_seq_s: float
    """Cost per running (decoding) request in a step."""
    prefill_per_cached_token_s: float = 0.0
    """Cost per prompt token taken from the prefix cache (the new tokens attend to it)."""
    decode_per_token_s: float = 0.0
    """Cost per context token of the running batch in a step (attention reads)."""
    max_batch: int = 16
    """Requests running at once."""
    max_step_tokens: int = 8192
    """Token budget of a step: the running requests' one each, then prompts."""
    block: int = 16
    """Prefix-cache block, tokens."""
    cache_blocks: int = 4096
    """Prefix-cache capacity, blocks (0: no prefix cache)."""
    loop_base_s: float = 0.0
    """The serving loop's cost per step beyond the engine's (``fit_loop``), fixed part."""
    loop_per_seq_s: float = 0.0
    """The same, per request that gets a token in the step."""
    path_s: float = 0.0
    """A request's way through the router and its first token's way back, seconds: added to
    every TTFT and end-to-end latency; 0: the replica alone."""

    @classmethod
    def from_json(cls, data: dict[str, Any], **over: Any) -> ReplicaProfile:
        """A profile from ``profile_engine``'s or ``fit_profile``'s dictionary; fields it
        lacks keep their defaults, ``over`` sets any field."""
        keys = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s")
        known = (*PROFILE_TERMS, "loop_base_s", "loop_per_seq_s", "path_s")
        vals = {k: float(data[k]) for k in keys} | {k: float(data[k]) for k in known if k in data}
        return cls(**vals, **over)

    def prefill_s(self, uncached: int, cached: int) -> float:
        """One admitted request's share of a step."""
        return (
            self.prefill_base_s
            + self.prefill_per_token_s * uncached
            + self.prefill_per_cached_token_s * cached
        )

    def decode_step_s(self, batch: int, context: float) -> float:
        """A step's decoding part: ``batch`` running requests holding ``context`` tokens,
        plus the serving loop's (``loop_s``)."""
        d = self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_token_s * context
        return d + self.loop_s(batch)

    def step_s(self, e: dict[str, float]) -> float:
        """The engine's cost of a logged step (``step_features``), the serving loop left out."""
        coef = [getattr(self, k) for k in PROFILE_TERMS]
        return float(np.dot(coef, step_features(e)))

    def loop_s(self, requests: int) -> float:
        """The serving loop's seconds around one step that gives ``requests`` a token."""
        return self.loop_base_s + self.loop_per_seq_s * requests


def nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost is never negative): the best
    unconstrained fit over every subset of the columns whose coefficients all come out
    non-negative; the others zero. Exact for the few columns a profile has."""
    k = a.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y**2))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.any(c < 0):
            continue
        err = float(np.sum((y - a[:, cols] @ c) ** 2))
        if err < best_err:
            best, best_err = np.zeros(k), err
            best[cols] = c
    return best


def fit_loop(log: list[dict[str, float]], engine: ReplicaProfile) -> dict[str, Any]:
    """The serving loop's ``loop_base_s`` and ``loop_per_seq_s``: non-negative least squares
    of each served step's ``wall + gap`` less its engine cost in ``engine`` (the idle
    profile) against the requests that got a token."""
    rows = [
        (e["batch"], e["wall"] + e.get("gap", 0.0) - engine.step_s(e)) for e in log if "wall" in e
    ]
    if len(rows) < 2:
        raise ValueError("fit_loop needs the log of at least two served steps")
    a = np.asarray(rows, dtype=float)
    base, per_seq = nonneg_lstsq(np.column_stack([np.ones(len(a)), a[:, 0]]), a[:, 1])
    return {
        "loop_base_s": float(base),
        "loop_per_seq_s": float(per_seq),
        "loop_iterations": len(rows),
        "loop_median_s": float(statistics.median(a[:, 1])),
    }


def fit_profile(log: list[dict[str, float]]) -> dict[str, Any]:
    """Step costs from an engine's step log (``GET /engine/log``): non-negative least squares
    of each step's seconds (``wall + gap`` where logged, else ``s``) against
    ``step_features``."""
    if not any(e.get("prefill", 0) for e in log) or not any(e.get("decode", 0) for e in log):
        raise ValueError("the step log needs steps with prompt tokens and with decoding ones")

    def cost(e: dict[str, float]) -> float:
        return e.get("wall", e["s"]) + e.get("gap", 0.0)

    a = np.asarray([step_features(e) for e in log], dtype=float)
    coef = nonneg_lstsq(a, np.asarray([cost(e) for e in log]))
    return {k: float(c) for k, c in zip(PROFILE_TERMS, coef, strict=True)}
