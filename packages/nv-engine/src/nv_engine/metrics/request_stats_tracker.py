"""RequestStatsTracker: the frontend's per-request clocks, turned into one IterationStats per step."""
from __future__ import annotations

import time
from dataclasses import dataclass

from nv_engine.metrics.iteration_stats import FinishedRequestStats, IterationStats


@dataclass(slots=True)
class _RequestTimes:
    arrival: float
    num_prompt_tokens: int
    scheduled: float | None = None        # first scheduled (None: not known to the frontend)
    first_token: float | None = None
    last_token: float = 0.0
    num_generation_tokens: int = 0


class RequestStatsTracker:
    """Call `add_request` when a request arrives, `observe` for each request with news in a step (new
    tokens and/or its finish), then `take_iteration_stats()` once per step for the stat loggers. Times
    are time.monotonic() seconds (system-wide on Linux, so an engine process's clock agrees).

    Without a first-scheduled time from the engine, the queue time counts as 0 and the prefill phase
    starts at arrival. A finished or unknown request id is ignored (an abort racing a finish)."""

    def __init__(self) -> None:
        self._requests: dict[str, _RequestTimes] = {}
        self._iteration = IterationStats()

    def __len__(self) -> int:
        return len(self._requests)

    def add_request(self, request_id: str, num_prompt_tokens: int, arrival_time: float | None = None) -> None:
        self._requests[request_id] = _RequestTimes(time.monotonic() if arrival_time is None else arrival_time,
                                                   num_prompt_tokens)

    def observe(self, request_id: str, num_new_tokens: int, finish_reason: str | None = None, *,
                now: float | None = None, first_scheduled_time: float | None = None) -> None:
        """`num_new_tokens` more output tokens of the request (over all its n completions) arrived at
        `now`; `finish_reason` ("stop" / "length" / "abort") when the request is done."""
        times = self._requests.get(request_id)
        if times is None:
            return
        if now is None:
            now = time.monotonic()
        if times.scheduled is None and first_scheduled_time is not None:
            times.scheduled = first_scheduled_time
        iteration = self._iteration
        if num_new_tokens > 0:
            if times.first_token is None:
                times.first_token = now
                iteration.time_to_first_tokens_s.append(now - times.arrival)
                iteration.num_prompt_tokens += times.num_prompt_tokens
            else:
                # one observation per token interval, also when an output carries several tokens (a
                # stream_interval above 1, speculative decoding): the histogram counts token gaps
                latency = (now - times.last_token) / num_new_tokens
                iteration.inter_token_latencies_s.extend([latency] * num_new_tokens)
            times.last_token = now
            times.num_generation_tokens += num_new_tokens
            iteration.num_generation_tokens += num_new_tokens
        if finish_reason is not None:
            del self._requests[request_id]
            scheduled = times.arrival if times.scheduled is None else times.scheduled
            first = times.first_token
            prefill = 0.0 if first is None else max(first - scheduled, 0.0)
            decode = 0.0 if first is None else times.last_token - first
            iteration.finished.append(FinishedRequestStats(
                finish_reason, now - times.arrival, max(scheduled - times.arrival, 0.0), prefill, decode,
                prefill + decode, times.num_prompt_tokens, times.num_generation_tokens))

    def take_iteration_stats(self) -> IterationStats:
        """What was observed since the last call."""
        iteration, self._iteration = self._iteration, IterationStats()
        return iteration
