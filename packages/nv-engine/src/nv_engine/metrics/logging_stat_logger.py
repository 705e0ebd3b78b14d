"""LoggingStatLogger: one INFO line per interval with the engine's throughput, queues, KV usage and
prefix-cache hit rate (the line vLLM logs every 10 s), and a second with the draft acceptance rate when
speculative decoding verified drafts in the interval."""
from __future__ import annotations

import logging
import time

from nv_engine.metrics.iteration_stats import IterationStats
from nv_kvcache import SchedulerStats

logger = logging.getLogger("nv_engine.metrics")


class LoggingStatLogger:
    """`record(scheduler_stats, iteration_stats)` once per engine step; it logs at most once per
    `interval_s`, from inside a record (no thread): throughputs are averaged over the time since the
    previous line, the hit rate over the prefix-cache queries since then (the last known rate when
    there were none). An idle engine's line goes to DEBUG, as vLLM's does. engine_index: the line of
    one core of several starts "Engine 001: " (vLLM's prefix)."""

    def __init__(self, interval_s: float = 10.0, *, engine_index: int | None = None) -> None:
        if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool) or interval_s < 0:
            raise ValueError(f"interval_s must be a number >= 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._prefix = "" if engine_index is None else f"Engine {engine_index:03d}: "
        self._last_log_time = time.monotonic()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._last_stats: SchedulerStats | None = None
        self._logged_queries = 0
        self._logged_hits = 0
        self._hit_rate = 0.0
        self._logged_drafts = 0
        self._logged_accepted = 0
        self._was_busy = False

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if iteration_stats is not None:
            self._num_prompt_tokens += iteration_stats.num_prompt_tokens
            self._num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self._last_stats = scheduler_stats
        now = time.monotonic()
        if now - self._last_log_time >= self.interval_s:
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = now - self._last_log_time
        prompt_throughput = self._num_prompt_tokens / elapsed if elapsed > 0 else 0.0
        generation_throughput = self._num_generation_tokens / elapsed if elapsed > 0 else 0.0
        self._last_log_time = now
        self._num_prompt_tokens = self._num_generation_tokens = 0
        stats = self._last_stats
        running = waiting = 0
        usage = 0.0
        if stats is not None:
            running, waiting, usage = stats.num_running, stats.num_waiting, stats.kv_cache_usage
            queries = stats.prefix_cache_queries - self._logged_queries
            if queries > 0:
                self._hit_rate = (stats.prefix_cache_hits - self._logged_hits) / queries
            self._logged_queries, self._logged_hits = stats.prefix_cache_queries, stats.prefix_cache_hits
            drafts = stats.num_draft_tokens - self._logged_drafts
            accepted = stats.num_accepted_tokens - self._logged_accepted
            self._logged_drafts, self._logged_accepted = stats.num_draft_tokens, stats.num_accepted_tokens
            if drafts > 0:
                logger.info("%sSpecDecoding metrics: Draft acceptance rate: %.1f%%, Accepted: %d tokens, Drafted: %d "
                            "tokens", self._prefix, 100 * accepted / drafts, accepted, drafts)
        busy = bool(prompt_throughput or generation_throughput)
        level = logging.INFO if busy or self._was_busy else logging.DEBUG
        self._was_busy = busy
        logger.log(level, "%sAvg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                   "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: "
                   "%.1f%%", self._prefix, prompt_throughput, generation_throughput, running, waiting, usage * 100,
                   self._hit_rate * 100)
