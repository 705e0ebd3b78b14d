"""PrefixIndex: which prompt blocks the frontend has sent to one engine core (the data-parallel dispatcher's
guess at that core's prefix cache)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from nv_kvcache import hash_block_tokens


class PrefixIndex:
    """The chained hashes of the full prompt blocks sent to one core, least recently used first, at most
    `capacity` of them (the core's KV blocks: it cannot hold more). The hashes are the block manager's
    (`nv_kvcache.hash_block_tokens`), so a hit here names a block the core registered when it computed
    that prompt, unless the core evicted it since: the index is a guess, never a promise.

    Not thread-safe: its owner serializes the calls."""

    def __init__(self, block_size: int, capacity: int) -> None:
        if block_size < 1 or capacity < 0:
            raise ValueError(f"block_size must be >= 1 and capacity >= 0, got {block_size}, {capacity}")
        self.block_size = block_size
        self.capacity = capacity
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The chained hashes of the prompt's full blocks (a partial last block has none)."""
        bs = self.block_size
        hashes: list[int] = []
        for start in range(0, len(token_ids) - bs + 1, bs):
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, token_ids[start:start + bs]))
        return hashes

    def match_length(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its `block_hashes`) this core was sent before. A chained
        hash covers every block before it, so the first miss ends the match."""
        found = 0
        for block_hash in hashes:
            if block_hash not in self._hashes:
                break
            found += 1
        return found

    def add(self, hashes: Sequence[int]) -> None:
        """Record a prompt sent to the core (its blocks become the most recently used); the least
        recently used hashes beyond `capacity` are forgotten."""
        index = self._hashes
        for block_hash in hashes:
            index[block_hash] = None
            index.move_to_end(block_hash)
        while len(index) > self.capacity:
            index.popitem(last=False)

    def clear(self) -> None:
        self._hashes.clear()
