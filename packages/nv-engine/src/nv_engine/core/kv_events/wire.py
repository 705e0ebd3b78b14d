"""The KV-event messages as they travel: msgspec Structs encoded with msgpack, field for field and
option for option vLLM's (vllm/distributed/kv_events.py: array_like, omit_defaults, tagged by class
name), so a subscriber written for vLLM decodes nv's batches. One object: the wire format."""
from __future__ import annotations

import msgspec

from nv_kvcache import AllBlocksCleared as CacheCleared
from nv_kvcache import BlockRemoved as CacheRemoved
from nv_kvcache import BlockStored as CacheStored
from nv_kvcache import KVCacheEvent as CacheEvent


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the events; on the wire each is [class name, *fields]."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """[ts (unix seconds), events, data_parallel_rank (left out when None)]."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def to_wire(event: CacheEvent) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """The wire message of a block manager event."""
    if isinstance(event, CacheStored):
        return BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                           event.lora_id, event.medium)
    if isinstance(event, CacheRemoved):
        return BlockRemoved(event.block_hashes, event.medium)
    if isinstance(event, CacheCleared):
        return AllBlocksCleared()
    raise TypeError(f"not a KV-cache event: {event!r}")
