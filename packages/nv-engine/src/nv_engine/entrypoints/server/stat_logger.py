"""ServerStatLogger: feeds the server's metrics (Prometheus and the periodic log line) from AsyncLLM's
per-step statistics."""
from __future__ import annotations

from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.engine.outputs import RequestOutput
from nv_engine.entrypoints.server.metrics import ServerMetrics
from nv_engine.metrics import RequestStatsTracker


class ServerStatLogger:
    """An AsyncLLM stat logger (AsyncLLM.stat_loggers). Per step it turns the request outputs (token counts,
    cumulative or delta) and the core's first-scheduled times into a RequestStatsTracker's IterationStats, and
    records them with the core's SchedulerStats snapshot in ServerMetrics: TTFT, inter-token latency,
    queue / prefill / decode / end-to-end times, token counters, finished requests, prefix-cache and
    preemption counters, the scheduler gauges and the step width.
    `record` runs in AsyncLLM's receiver thread; `forget` may run on the event loop (the tracker ignores
    an id it no longer holds, so an abort racing a finish counts once)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.tracker = RequestStatsTracker()
        self._tokens_seen: dict[str, dict[int, int]] = {}    # open request -> completion index -> tokens
        self._first_scheduled: dict[str, float] = {}          # scheduled before its first output

    def record(self, core_outputs: EngineCoreOutputs, request_outputs: list[RequestOutput],
               arrival_times: dict[str, float], now: float) -> None:
        tracker = self.tracker
        self._first_scheduled.update(core_outputs.first_scheduled)
        if request_outputs:
            self.metrics.step_batch_size.observe(len(request_outputs))
        for out in request_outputs:
            request_id = out.request_id
            seen = self._tokens_seen.get(request_id)
            if seen is None:
                seen = self._tokens_seen[request_id] = {}
                tracker.add_request(request_id, len(out.prompt_token_ids or ()),
                                    arrival_times.get(request_id, now))
            new_tokens = 0
            for comp in out.outputs:
                count = len(comp.token_ids) + (seen.get(comp.index, 0) if out.delta else 0)
                new_tokens += count - seen.get(comp.index, 0)
                seen[comp.index] = count
            reason = None
            if out.finished:
                reason = str(out.outputs[0].finish_reason) if out.outputs else "abort"
                del self._tokens_seen[request_id]
            tracker.observe(request_id, new_tokens, reason, now=now,
                            first_scheduled_time=self._first_scheduled.pop(request_id, None))
        self.metrics.record(core_outputs.scheduler_stats, tracker.take_iteration_stats(), core_outputs.engine_index)

    def forget(self, request_ids: list[str]) -> None:
        """Requests that ended without a finished output (aborted, failed): counted as aborted."""
        for request_id in request_ids:
            self._first_scheduled.pop(request_id, None)
            if self._tokens_seen.pop(request_id, None) is not None:
                self.tracker.observe(request_id, 0, "abort")
