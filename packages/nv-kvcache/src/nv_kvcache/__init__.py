"""Pure-Python paged KV-cache core: sequences, block manager with prefix caching, scheduler."""
from nv_kvcache.__about__ import __version__
from nv_kvcache.block_manager import BlockManager, hash_block_tokens
from nv_kvcache.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from nv_kvcache.scheduler import Scheduler
from nv_kvcache.scheduler_output import ScheduledSeq, SchedulerOutput
from nv_kvcache.scheduler_stats import SchedulerStats
from nv_kvcache.sequence import FinishReason, Sequence, SequenceStatus, StopRules

__all__ = [
    "__version__", "AllBlocksCleared", "BlockManager", "BlockRemoved", "BlockStored", "FinishReason",
    "KVCacheEvent", "ScheduledSeq", "Scheduler", "SchedulerOutput", "SchedulerStats", "Sequence",
    "SequenceStatus", "StopRules", "hash_block_tokens",
]
