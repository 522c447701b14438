"""Prefix blocks: the unit of prefix caching and of cache-aware routing.

A prompt is cut into full blocks of ``block`` tokens (characters, for text);
block ``i`` is named by a chained hash of blocks ``0..i``, so equal hashes mean
equal prefixes (vLLM's automatic prefix caching names its KV blocks the same
way). A ``BlockLRU`` holds up to ``capacity`` named blocks, least recently
used evicted first. The router keeps one per replica as an *approximate*
prefix tree of what that replica has cached (a tree whose edges are blocks);
the reference replica keeps one whose values are the KV tensors; the
simulator keeps one per simulated replica.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_BLOCK = 16


def block_hashes(seq: str | Sequence[int], block: int = DEFAULT_BLOCK) -> list[int]:
    """Chained hashes of the full blocks of ``seq`` (a string or token ids)."""
    out: list[int] = []
    h = 0
    for i in range(0, len(seq) - block + 1, block):
        piece = seq[i : i + block]
        h = hash((h, piece if isinstance(piece, str) else tuple(piece)))
        out.append(h)
    return out


class BlockLRU:
    """Named blocks with optional values, least recently used evicted first."""

    def __init__(self, capacity: int, on_evict: Callable[[int], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"prefix cache capacity {capacity} is below 1 block")
        self.capacity = capacity
        self.on_evict = on_evict
        """Called with each evicted hash (the router's owner index uses it)."""
        self._d: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def match(self, hashes: Sequence[int], *, touch: bool = True) -> int:
        """How many leading blocks of ``hashes`` are held (marking them used)."""
        n = 0
        d = self._d
        for h in hashes:
            if h not in d:
                break
            if touch:
                d.move_to_end(h)
            n += 1
        return n

    def get(self, h: int) -> Any:
        return self._d[h]

    def put(self, h: int, value: Any = None) -> None:
        d = self._d
        if h in d:
            d.move_to_end(h)
            if value is not None:
                d[h] = value
            return
        d[h] = value
        while len(d) > self.capacity:
            old, _ = d.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old)

    def insert(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self.put(h)

    def clear(self) -> None:
        if self.on_evict is not None:
            for h in self._d:
                self.on_evict(h)
        self._d.clear()

    def __contains__(self, h: int) -> bool:
        return h in self._d
