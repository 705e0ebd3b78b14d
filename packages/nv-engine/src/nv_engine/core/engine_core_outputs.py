"""EngineCoreOutputs: everything the engine core reports after one step."""
from __future__ import annotations

from dataclasses import dataclass, field

from nv_engine.core.sequence_update import SequenceUpdate
from nv_kvcache import SchedulerStats


@dataclass
class EngineCoreOutputs:
    """The step's SequenceUpdates plus what the frontend's statistics need.

    Times are time.monotonic() in the core (the same clock as the frontend's on one host).
    first_scheduled: request id -> when the request was first scheduled (its queue time ends), for
    the requests first scheduled in this step. scheduler_stats: the scheduler's `stats()` snapshot
    (queue lengths, KV usage, cumulative prefix-cache and preemption counters).
    failed: (request id, message) for requests the core dropped: an add it refused, or the requests
    of a step that raised (the frontend fails them).
    tokens: (prompt tokens computed, tokens sampled) in the step.
    engine_index: which core of a data-parallel frontend sent them (0 with one core)."""

    updates: list[SequenceUpdate]
    timestamp: float
    first_scheduled: dict[str, float] = field(default_factory=dict)
    scheduler_stats: SchedulerStats | None = None
    failed: list[tuple[str, str]] = field(default_factory=list)
    tokens: tuple[int, int] = (0, 0)
    engine_index: int = 0
