"""Request-to-replica routing policies: pure logic, shared by the router and the simulator.

A policy sees, per live replica, its load (requests routed to it and not yet
finished) and, for the cache-aware policy, an approximate prefix tree of what
it has cached (``BlockLRU`` of chained block hashes, ``prefix.py``). It
returns the index of the replica to use. Nothing here does I/O.

- ``round_robin``: the next live replica in turn.
- ``random``: uniform, from a seeded generator.
- ``least_outstanding``: the fewest requests in flight (ties: at random).
- ``power_of_two``: two distinct replicas at random, the less loaded one
  (Mitzenmacher's power of two choices).
- ``cache_aware``: SGLang's router (``sgl-router`` ``cache_aware`` policy):
  if the load is uneven -- ``max - min > balance_abs`` *and*
  ``max > min * balance_rel`` -- the shortest queue; otherwise the replica
  whose tree matches the longest prefix of the prompt, if the matched
  fraction exceeds ``cache_threshold``, else the least loaded one (SGLang
  picks the smallest tree there; least loaded is what parlab's brief asks).
  The chosen replica's tree then takes the prompt's blocks. Defaults follow
  sgl-router: threshold 0.5, balance_abs 32, balance_rel 1.0001.

Every policy also keeps the per-replica trees up to date (``observe``), so
the router can estimate cache hits under any policy, not only the cache-aware
one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.serve.prefix import BlockLRU

POLICIES = ("round_robin", "random", "least_outstanding", "power_of_two", "cache_aware")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Knobs of the policies (only ``cache_aware`` uses the thresholds)."""

    name: str = "round_robin"
    """One of ``POLICIES``."""
    seed: int = 0
    """Seed for ``random``, ``power_of_two`` and tie-breaks."""
    cache_threshold: float = 0.5
    """Matched-prefix fraction above which ``cache_aware`` follows the cache."""
    balance_abs: int = 32
    """Load gap (requests) beyond which the load counts as uneven ..."""
    balance_rel: float = 1.0001
    """... when also ``max > min * balance_rel``."""
    tree_blocks: int = 1 << 16
    """Capacity of each replica's approximate tree, in blocks."""

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise UsageError(f"routing policy {self.name!r} is not one of {', '.join(POLICIES)}")
        if not 0 <= self.cache_threshold <= 1:
            raise UsageError(f"--cache-threshold {self.cache_threshold} is outside [0, 1]")
        if self.balance_abs < 0 or self.balance_rel < 1:
            raise UsageError("--balance-abs must be >= 0 and --balance-rel >= 1")


class Router:
    """The routing state of N replicas under one policy."""

    def __init__(self, n: int, config: PolicyConfig) -> None:
        if n < 1:
            raise UsageError("routing needs at least one replica")
        self.config = config
        self.n = n
        self.load = [0] * n
        self.alive = [True] * n
        self.trees = [BlockLRU(config.tree_blocks) for _ in range(n)]
        self._rng = random.Random(config.seed)
        self._rr = 0

    def _live(self) -> list[int]:
        return [i for i in range(self.n) if self.alive[i]]

    def _least(self, cands: Sequence[int]) -> int:
        best = min(self.load[i] for i in cands)
        ties = [i for i in cands if self.load[i] == best]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    def choose(self, hashes: Sequence[int]) -> tuple[int, int]:
        """Pick a live replica for a prompt with these block hashes.

        Returns ``(replica, estimated cached blocks)``; ``IndexError`` when no
        replica is alive. The caller adds the load and calls ``done`` later.
        """
        live = self._live()
        if not live:
            raise IndexError("no live replica")
        name = self.config.name
        if name == "round_robin":
            k = self._rr % len(live)
            self._rr += 1
            pick = live[k]
        elif name == "random":
            pick = self._rng.choice(live)
        elif name == "least_outstanding":
            pick = self._least(live)
        elif name == "power_of_two":
            pick = live[0] if len(live) == 1 else self._least(self._rng.sample(live, 2))
        else:
            pick = self._cache_aware(live, hashes)
        matched = self.trees[pick].match(hashes)
        self.trees[pick].insert(hashes)
        return pick, matched

    def _cache_aware(self, live: Sequence[int], hashes: Sequence[int]) -> int:
        cfg = self.config
        loads = [self.load[i] for i in live]
        hi, lo = max(loads), min(loads)
        if hi - lo > cfg.balance_abs and hi > lo * cfg.balance_rel:
            return self._least(live)
        if not hashes:
            return self._least(live)
        matches = [(self.trees[i].match(hashes, touch=False), i) for i in live]
        best = max(m for m, _ in matches)
        if best / len(hashes) > cfg.cache_threshold:
            return self._least([i for m, i in matches if m == best])
        return self._least(live)

    def start(self, i: int) -> None:
        self.load[i] += 1

    def done(self, i: int) -> None:
        self.load[i] -= 1
        assert self.load[i] >= 0

    def set_alive(self, i: int, alive: bool) -> None:
        if not alive and self.alive[i]:
            self.trees[i].clear()  # a restarted replica has an empty cache
        self.alive[i] = alive
