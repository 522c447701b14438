"""Request-to-replica routing policies: pure logic, shared by the router and the simulator.

A policy sees each live replica's load (requests routed to it and not yet finished) and an
approximate prefix tree of what it has cached (a ``BlockLRU`` of chained block hashes,
``prefix.py``), and returns a replica's index. No I/O.

- ``round_robin``: the next live replica in turn;
- ``random``: uniform, from a seeded generator;
- ``least_outstanding``: the fewest requests in flight (ties at random);
- ``power_of_two``: the less loaded of two distinct random replicas (Mitzenmacher);
- ``cache_aware``: sgl-router's: when the load is uneven (``max - min > balance_abs`` and
  ``max > min * balance_rel``) the shortest queue; else the replica whose tree matches the
  longest prefix of the prompt if the matched fraction exceeds ``cache_threshold``, else the
  least loaded one (sgl-router picks the smallest tree there). Defaults are sgl-router's:
  0.5, 32, 1.0001.

Every policy keeps the trees up to date, so the router estimates cache hits under any policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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


class PolicyState:
    """The routing state of N replicas under one policy.

    Loads are kept in buckets (load -> replicas) so that the least and most
    loaded replica cost O(1) at 1,000 replicas; the cache-aware policy only
    matches the replicas whose tree holds the prompt's first block (an owner
    index kept up to date on insert and eviction).
    """

    def __init__(self, n: int, config: PolicyConfig) -> None:
        if n < 0:
            raise UsageError("routing needs a replica count >= 0")
        self.config = config
        self.n = n
        self.load = [0] * n
        self.alive = [True] * n
        self._owners: dict[int, set[int]] = {}
        self.trees = [BlockLRU(config.tree_blocks, self._evictor(i)) for i in range(n)]
        self._rng = random.Random(config.seed)
        self._rr = 0
        self._live = list(range(n))
        self._buckets: dict[int, set[int]] = {0: set(range(n))}
        self._lo = 0
        self._hi = 0

    def _evictor(self, i: int) -> Callable[[int], None]:
        def evict(h: int) -> None:
            owners = self._owners.get(h)
            if owners is not None:
                owners.discard(i)
                if not owners:
                    del self._owners[h]

        return evict

    # -- loads ---------------------------------------------------------------
    def _move(self, i: int, old: int | None, new: int | None) -> None:
        if old is not None:
            b = self._buckets[old]
            b.discard(i)
            if not b:
                del self._buckets[old]
        if new is not None:
            self._buckets.setdefault(new, set()).add(i)
            self._lo = min(self._lo, new)
            self._hi = max(self._hi, new)

    def _min_load(self) -> int:
        while self._lo not in self._buckets:
            self._lo += 1
        return self._lo

    def _max_load(self) -> int:
        while self._hi > 0 and self._hi not in self._buckets:
            self._hi -= 1
        return self._hi

    def _least_all(self) -> int:
        bucket = self._buckets[self._min_load()]
        if len(bucket) <= 64:
            return self._rng.choice(sorted(bucket))
        return next(iter(bucket))

    def _least(self, cands: Sequence[int]) -> int:
        best = min(self.load[i] for i in cands)
        ties = [i for i in cands if self.load[i] == best]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    # -- choice --------------------------------------------------------------
    def choose(self, hashes: Sequence[int]) -> tuple[int, int]:
        """Pick a live replica for a prompt with these block hashes.

        Returns ``(replica, estimated cached blocks)``; ``IndexError`` when no
        replica is alive. The caller calls ``start`` and later ``done``.
        """
        live = self._live
        if not live:
            raise IndexError("no live replica")
        name = self.config.name
        if name == "round_robin":
            pick = live[self._rr % len(live)]
            self._rr += 1
        elif name == "random":
            pick = self._rng.choice(live)
        elif name == "least_outstanding":
            pick = self._least_all()
        elif name == "power_of_two":
            pick = live[0] if len(live) == 1 else self._least(self._rng.sample(live, 2))
        else:
            pick = self._cache_aware(hashes)
        tree = self.trees[pick]
        matched = tree.match(hashes)
        tree.insert(hashes)
        if hashes:
            self._owners.setdefault(hashes[0], set()).add(pick)
        return pick, matched

    def _cache_aware(self, hashes: Sequence[int]) -> int:
        cfg = self.config
        hi, lo = self._max_load(), self._min_load()
        if hi - lo > cfg.balance_abs and hi > lo * cfg.balance_rel:
            return self._least_all()
        if not hashes:
            return self._least_all()
        owners = [i for i in self._owners.get(hashes[0], ()) if self.alive[i]]
        if owners:
            matches = [(self.trees[i].match(hashes, touch=False), i) for i in owners]
            best = max(m for m, _ in matches)
            if best / len(hashes) > cfg.cache_threshold:
                return self._least([i for m, i in matches if m == best])
        return self._least_all()

    def start(self, i: int) -> None:
        """A request was sent to replica ``i``."""
        self.load[i] += 1
        if self.alive[i]:
            self._move(i, self.load[i] - 1, self.load[i])

    def done(self, i: int) -> None:
        """A request of replica ``i`` ended (completed or failed)."""
        self.load[i] -= 1
        assert self.load[i] >= 0
        if self.alive[i]:
            self._move(i, self.load[i] + 1, self.load[i])

    def add(self) -> int:
        """A new replica (alive, no load, an empty tree); its index."""
        i = self.n
        self.n += 1
        self.load.append(0)
        self.alive.append(True)
        self.trees.append(BlockLRU(self.config.tree_blocks, self._evictor(i)))
        self._move(i, None, 0)
        self._live = [j for j in range(self.n) if self.alive[j]]
        return i

    def set_alive(self, i: int, alive: bool) -> None:
        if alive == self.alive[i]:
            return
        if not alive:
            self.trees[i].clear()  # a replica that comes back has an empty cache
            self._move(i, self.load[i], None)
        else:
            self._move(i, None, self.load[i])
        self.alive[i] = alive
        self._live = [j for j in range(self.n) if self.alive[j]]
