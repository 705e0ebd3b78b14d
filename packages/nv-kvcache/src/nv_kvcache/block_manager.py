"""Paged KV-cache blocks: allocation, reference counts and prefix caching (no torch).

A block holds `block_size` token slots. A block that is full AND whose KV has been computed gets a
content hash (chained: block i's hash covers block i-1's hash and block i's token ids) and is
registered in `hash -> block id`. A later sequence whose prompt starts with the same blocks shares
them (reference count + 1) instead of recomputing them.

Freed blocks go to the back of a free queue and keep their hash, so they can still be hit until
the queue hands them out again (least-recently-freed first; a hit takes a block out of the queue).
A sequence frees its blocks tail first, so its prefix, more likely to be shared, survives longer.
Ideas from nano-vllm's BlockManager and vLLM v1's KVCacheManager / FreeKVCacheBlockQueue.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence as SequenceABC

import xxhash

from nv_kvcache.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from nv_kvcache.sequence import Sequence


def hash_block_tokens(parent_hash: int | None, token_ids: SequenceABC[int]) -> int:
    """xxh64 over (parent hash as 8 little-endian bytes, token ids as int64). First block: no parent."""
    data = array("q", token_ids).tobytes()
    if parent_hash is not None:
        data = parent_hash.to_bytes(8, "little") + data
    return xxhash.xxh64_intdigest(data)


class BlockManager:
    """A pool of `num_blocks` blocks of `block_size` tokens, with optional prefix caching.

    Invariants: every block is either in the free queue (ref count 0) or referenced by sequences
    (ref count = number of block tables holding it); a block id is never twice in the queue;
    a registered hash maps to exactly one block, which carries that hash.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 enable_kv_cache_events: bool = False) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref_counts: list[int] = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks
        self._tokens: list[list[int] | None] = [None] * num_blocks     # content of a hashed block
        self._hash_to_block: dict[int, int] = {}
        # block id -> None, ordered by free time: the front is reused first.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_query_tokens = 0     # tokens of admitted sequences (prefix-cache lookups)
        self.num_hit_tokens = 0       # of those, tokens served from the cache
        # prefix-cache events since the last take_events(); None: not recorded (costs one None check)
        self._events: list[KVCacheEvent] | None = [] if enable_kv_cache_events else None

    # ---- stats -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks (in use or free) holding a registered prefix hash."""
        return len(self._hash_to_block)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0.0 .. 1.0)."""
        return (self.num_blocks - len(self._free)) / self.num_blocks

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hit rate in tokens over all admissions so far (0.0 before any)."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def block_hash(self, block_id: int) -> int | None:
        return self._hashes[block_id]

    def free_block_ids(self) -> list[int]:
        """Free block ids in the order they will be handed out."""
        return list(self._free)

    def take_events(self) -> list[KVCacheEvent]:
        """The prefix-cache events recorded since the last call, oldest first ([] when not recording)."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def cdiv_blocks(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    # ---- hashing -----------------------------------------------------------------------------
    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of seq's first `num_blocks` full blocks (cached on the sequence;
        valid forever since a sequence's token ids only grow)."""
        hashes = seq._block_hashes
        bs = self.block_size
        tokens = seq.token_ids
        if num_blocks > len(tokens) // bs:
            raise ValueError(f"sequence {seq.seq_id} has only {len(tokens) // bs} full blocks")
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if i else None, tokens[i * bs:(i + 1) * bs]))
        return hashes

    # ---- allocation --------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of cached full blocks equal to seq's leading blocks (not yet referenced).

        Never covers the whole sequence: at most (num_tokens - 1) // block_size blocks, so at least
        one token is left to compute and the step has logits to sample from."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        tokens = seq.token_ids
        max_blocks = (len(tokens) - 1) // bs
        hits: list[int] = []
        hashes = seq._block_hashes
        for i in range(max_blocks):
            if i == len(hashes):
                self.block_hashes(seq, i + 1)
            block_id = self._hash_to_block.get(hashes[i])
            # The token check guards against a hash collision.
            if block_id is None or self._tokens[block_id] != tokens[i * bs:(i + 1) * bs]:
                break
            hits.append(block_id)
        return hits

    def num_blocks_to_allocate(self, seq: Sequence, num_tokens: int, cached_blocks: SequenceABC[int] = ()) -> int:
        """Free blocks that allocate(seq, num_tokens, cached_blocks) would take from the queue."""
        new = -(-num_tokens // self.block_size) - len(seq.block_table) - len(cached_blocks)
        if not cached_blocks:
            return new if new > 0 else 0
        revived = sum(1 for b in cached_blocks if self._ref_counts[b] == 0)
        return max(new, 0) + revived

    def allocate(self, seq: Sequence, num_tokens: int, cached_blocks: SequenceABC[int] = ()) -> bool:
        """Grow seq.block_table to hold `num_tokens` tokens; False (nothing changed) when the free
        queue is too short. `cached_blocks` (from match_prefix, only for a sequence holding no
        blocks yet) are shared first. An admission (empty block table) updates the hit-rate stats."""
        table = seq.block_table
        is_admission = not table
        if cached_blocks and not is_admission:
            raise ValueError("cached_blocks can only be given to a sequence that holds no blocks")
        if self.num_blocks_to_allocate(seq, num_tokens, cached_blocks) > len(self._free):
            return False
        ref_counts = self._ref_counts
        if cached_blocks:
            for block_id in cached_blocks:
                if ref_counts[block_id] == 0:
                    del self._free[block_id]
                ref_counts[block_id] += 1
                table.append(block_id)
            seq._num_hashed_blocks = len(cached_blocks)
        for _ in range(-(-num_tokens // self.block_size) - len(table)):
            block_id = self._pop_free()
            ref_counts[block_id] = 1
            table.append(block_id)
        if is_admission:
            self.num_query_tokens += len(seq.token_ids)
            self.num_hit_tokens += len(cached_blocks) * self.block_size
        return True

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block_hash = self._hashes[block_id]
        if block_hash is not None:          # evict its cached content
            if self._hash_to_block.get(block_hash) == block_id:
                del self._hash_to_block[block_hash]
                if self._events is not None:
                    self._events.append(BlockRemoved([block_hash]))
            self._hashes[block_id] = None
            self._tokens[block_id] = None
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of seq's blocks that are full and computed (and not yet registered).

        A block whose content is already cached in another block stays unregistered (both hold the
        same KV; the registered one serves later hits)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        table = seq.block_table
        num_full = min(seq.num_computed_tokens // bs, len(table))
        hashes = seq._block_hashes
        tokens = seq.token_ids
        hash_to_block = self._hash_to_block
        recording = self._events is not None
        stored: list[int] = []        # block indices registered here (recorded as events)
        for i in range(seq._num_hashed_blocks, num_full):
            chunk = tokens[i * bs:(i + 1) * bs]
            if i < len(hashes):
                block_hash = hashes[i]
            else:                                   # hashes is a prefix: here len(hashes) == i
                block_hash = hash_block_tokens(hashes[i - 1] if i else None, chunk)
                hashes.append(block_hash)
            block_id = table[i]
            if block_hash not in hash_to_block and self._hashes[block_id] is None:
                hash_to_block[block_hash] = block_id
                self._hashes[block_id] = block_hash
                self._tokens[block_id] = chunk
                if recording:
                    stored.append(i)
        if stored:
            self._record_stored(seq, stored)
        if num_full > seq._num_hashed_blocks:
            seq._num_hashed_blocks = num_full

    def _record_stored(self, seq: Sequence, indices: list[int]) -> None:
        """One BlockStored per run of consecutive block indices of seq registered in one call."""
        events = self._events
        if events is None:
            return
        bs = self.block_size
        hashes = seq._block_hashes
        tokens = seq.token_ids
        start = 0
        for k in range(1, len(indices) + 1):
            if k < len(indices) and indices[k] == indices[k - 1] + 1:
                continue
            first, last = indices[start], indices[k - 1]
            events.append(BlockStored(hashes[first:last + 1], hashes[first - 1] if first else None,
                                      tokens[first * bs:(last + 1) * bs], bs))
            start = k

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first, and clear its block table."""
        ref_counts = self._ref_counts
        free = self._free
        for block_id in reversed(seq.block_table):
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                free[block_id] = None
        seq.block_table.clear()
        seq._num_hashed_blocks = 0

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free blocks (in-use blocks keep theirs); returns how many.
        Events: AllBlocksCleared when nothing stays cached, else one BlockRemoved of the dropped hashes."""
        dropped = 0
        removed: list[int] = []
        for block_id in self._free:
            block_hash = self._hashes[block_id]
            if block_hash is not None:
                if self._hash_to_block.get(block_hash) == block_id:
                    del self._hash_to_block[block_hash]
                    removed.append(block_hash)
                self._hashes[block_id] = None
                self._tokens[block_id] = None
                dropped += 1
        if self._events is not None and removed:
            self._events.append(BlockRemoved(removed) if self._hash_to_block else AllBlocksCleared())
        return dropped

    def stats(self) -> dict[str, float]:
        return {"num_blocks": self.num_blocks, "free_blocks": self.num_free_blocks,
                "used_blocks": self.num_used_blocks, "cached_blocks": self.num_cached_blocks,
                "usage": self.usage, "hit_rate": self.hit_rate}
