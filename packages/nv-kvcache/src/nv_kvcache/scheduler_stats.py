"""SchedulerStats: the scheduler's figures after a step, for metrics (vLLM's `SchedulerStats`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot (picklable; cheap to build every step). The counters are cumulative since
    the scheduler was made: a consumer that wants per-interval figures subtracts its last snapshot."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float           # used blocks / all blocks, 0.0 .. 1.0
    prefix_cache_queries: int       # tokens of admitted sequences looked up in the prefix cache
    prefix_cache_hits: int          # of those, tokens served from the cache
    num_preemptions: int            # sequences sent back to waiting to free blocks
    num_draft_tokens: int = 0       # speculative decoding: draft tokens verified
    num_accepted_tokens: int = 0    # of those, accepted (acceptance rate = accepted / draft)
