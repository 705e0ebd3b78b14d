"""What happens to the prefix cache, for KV-aware routers (the events of vLLM's kv_events, as plain
frozen dataclasses: the engine puts them on the wire). The BlockManager records them only when asked.

Replaying every event in order (add the hashes of BlockStored, drop those of BlockRemoved, drop all on
AllBlocksCleared) gives exactly the set of hashes the block manager holds in its prefix cache."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive full blocks of one sequence entered the prefix cache. block_hashes[i] covers
    token_ids[i * block_size:(i + 1) * block_size]; parent_block_hash is the hash of the block before
    the first one (None when the first is a sequence's first block)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks lost their content (evicted for reuse, or dropped by a prefix-cache reset)."""

    block_hashes: list[int]
    medium: str | None = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The prefix cache holds nothing any more."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
