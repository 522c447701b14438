"""The KV cache's pages: a free list, reference counts, and the prefix cache over them.

A page (block) holds ``block`` tokens' K and V in every layer (``runner.py`` keeps the
tensors). Page 0 is the null page: padding rows of a captured step write there and nothing
reads it, so it is never handed out. A running sequence holds its pages by reference; a
prompt block, once its K/V are written, is entered under its chained hash
(``prefix.block_hashes``: equal hashes, equal prefixes), and a later prompt with the same
prefix takes those pages by reference (its reference count goes up) instead of computing or
copying them. A page nobody references keeps its hash and waits, least recently used first,
until the free list runs dry and it is taken for new content (vLLM's automatic prefix
caching, with pages never copied).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


class BlockPool:
    """Pages ``1 .. num_blocks - 1``: ``take``, ``share``, ``release``, ``register``."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 pages, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._by_hash: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()
        """Hashed pages nobody references, least recently used first."""
        self.hits = 0
        """Pages taken from the prefix cache so far."""

    @property
    def available(self) -> int:
        """Pages ``take`` can hand out now (free, or cached and idle)."""
        return len(self._free) + len(self._idle)

    @property
    def cached(self) -> int:
        """Pages held under a hash."""
        return len(self._by_hash)

    def match(self, hashes: Sequence[int]) -> list[int]:
        """The pages of the longest cached prefix of ``hashes``."""
        out = []
        for h in hashes:
            b = self._by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def share(self, blocks: Sequence[int]) -> None:
        """Reference cached pages (a prefix-cache hit)."""
        for b in blocks:
            if self.ref[b] == 0:
                self._idle.pop(b, None)
            self.ref[b] += 1
        self.hits += len(blocks)

    def take(self, n: int) -> list[int]:
        """``n`` pages for new content (free ones first, then the idle cached pages least
        recently used, whose hashes are dropped); ``ValueError`` if fewer are available."""
        if n > self.available:
            raise ValueError(f"{n} pages asked, {self.available} available")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._idle.popitem(last=False)
                del self._by_hash[self._hash_of.pop(b)]
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each page; a page nobody holds goes back (a hashed one to
        the idle end of the cache, most recently used)."""
        for b in blocks:
            self.ref[b] -= 1
            assert self.ref[b] >= 0, f"page {b} released more often than taken"
            if self.ref[b] == 0:
                if b in self._hash_of:
                    self._idle[b] = None
                else:
                    self._free.append(b)

    def register(self, block: int, h: int) -> None:
        """Enter a written page under its prefix hash (kept as it is if the hash is held)."""
        if h in self._by_hash or block in self._hash_of:
            return
        self._by_hash[h] = block
        self._hash_of[block] = h

    def clear(self) -> None:
        """Forget every hash (the pages in use stay with their sequences)."""
        for b in self._idle:
            self._free.append(b)
        self._idle.clear()
        self._by_hash.clear()
        self._hash_of.clear()
