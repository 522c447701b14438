"""What the router records: each replica's counters (``ReplicaStats``) and the body of
``GET /router/stats`` -- per replica, the totals and the routing overhead's percentiles."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from parlab.serve.policy import PolicyState


@dataclass
class ReplicaStats:
    """One replica's counters, as the router saw its requests and health checks."""

    url: str
    routed: int = 0
    completed: int = 0
    failed: int = 0
    retried_away: int = 0
    prompt_tokens: int = 0
    est_cached_tokens: int = 0
    health_misses: int = 0
    taken_out: int = 0
    client_gone: int = 0
    client_errors: int = 0
    cut: int = 0
    """In-flight requests cut when the replica was taken out."""
    info: dict[str, Any] = field(default_factory=dict)
    """What it registered with (engine, version, model, ...)."""


def count_status(r: ReplicaStats, status: int) -> None:
    """Count a request the replica answered with ``status``."""
    if status == 200:
        r.completed += 1
        r.health_misses = 0  # it just served a request: it is alive
    elif 400 <= status < 500:
        r.client_errors += 1  # the client's request was wrong, not the replica
    else:
        r.failed += 1


def _pct(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p99_ms": 0.0}
    a = np.asarray(xs) * 1e3
    return {
        "n": len(xs),
        "mean_ms": float(a.mean()),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
    }


def stats_body(
    policy: str,
    replicas: list[ReplicaStats],
    state: PolicyState,
    *,
    no_replica: int,
    decision_s: list[float],
    forward_s: list[float],
) -> dict[str, Any]:
    """``GET /router/stats``: per replica its state and counters; the estimated cache hit
    rate; the policy's decision time and the time to forward, as percentiles."""
    counters = [f.name for f in fields(ReplicaStats) if f.name not in ("url", "health_misses")]
    reps = [
        {"url": r.url, "alive": state.alive[i], "load": state.load[i]}
        | {k: getattr(r, k) for k in counters}
        for i, r in enumerate(replicas)
    ]
    pt = sum(r.prompt_tokens for r in replicas)
    ct = sum(r.est_cached_tokens for r in replicas)
    return {
        "policy": policy,
        "replicas": reps,
        "no_replica": no_replica,
        "est_cache_hit_rate": (ct / pt) if pt else None,
        "decision": _pct(decision_s),
        "pre_forward": _pct(forward_s),
    }
