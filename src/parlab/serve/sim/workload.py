"""What the simulator serves: the requests as arrays (``Workload``) and, optionally, the
prefill/decode split of the replicas (``Disaggregation``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parlab.serve.prefix import block_hashes
from parlab.serve.tokenizer import get


@dataclass(frozen=True, kw_only=True)
class Disaggregation:
    """The prefill/decode split."""

    prefill_replicas: int
    """Replicas that only prefill."""
    decode_replicas: int
    """Replicas that only decode."""
    kv_bytes_per_token: int
    """KV-cache bytes of one token (all layers, K and V)."""
    kv_base_s: float = 0.0
    """Fixed cost of one transfer (measured latency)."""
    kv_bandwidth: float = 1e11
    """Bytes per second of the transfer (measured)."""


@dataclass
class Workload:
    """Requests as arrays (``from_dataset`` or ``shared_prefix_arrays``)."""

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hashes: list[list[int]] | None = None
    """Block hashes per request (real prompts); else built from groups."""
    group: np.ndarray | None = None
    prefix_len: np.ndarray | None = None


def from_dataset(dataset: Any, arrival: np.ndarray, block: int = 16) -> Workload:
    """A workload of a ``Dataset``'s requests, hashed as the replica hashes them."""
    tok = get()
    ids = [tok.encode(r.prompt) for r in dataset.requests]
    return Workload(
        arrival=np.asarray(arrival, dtype=np.float64),
        prompt_len=np.asarray([len(x) for x in ids]),
        output_len=np.asarray([r.output_len for r in dataset.requests]),
        hashes=[block_hashes(x, block) for x in ids],
    )


def shared_prefix_arrays(
    *,
    n: int,
    groups: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    rate: float,
    seed: int = 0,
) -> Workload:
    """A large shared-prefix workload as arrays (no text), Poisson arrivals."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return Workload(
        arrival=np.cumsum(gaps),
        prompt_len=np.full(n, prefix_len + question_len),
        output_len=np.full(n, output_len),
        group=rng.integers(0, groups, size=n),
        prefix_len=np.full(n, prefix_len),
    )
