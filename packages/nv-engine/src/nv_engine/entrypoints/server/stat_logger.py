"""ServerStatLogger: feeds the server's Prometheus metrics from AsyncLLM's per-step statistics."""
from __future__ import annotations

from dataclasses import dataclass, field

from nv_engine.engine_core_outputs import EngineCoreOutputs
from nv_engine.entrypoints.server.metrics import ServerMetrics
from nv_engine.outputs import RequestOutput


@dataclass
class _Seen:
    """What the logger knows of one open request: tokens per completion, when the last came."""

    tokens_by_index: dict[int, int] = field(default_factory=dict)
    first_token_time: float | None = None
    last_token_time: float = 0.0


class ServerStatLogger:
    """An AsyncLLM stat logger (AsyncLLM.stat_loggers): TTFT, time per output token, end-to-end
    latency, token counters, finished requests, the step width and the scheduler gauges.
    `record` runs in AsyncLLM's receiver thread; `forget` may run on the event loop."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self._seen: dict[str, _Seen] = {}

    def record(self, core_outputs: EngineCoreOutputs, request_outputs: list[RequestOutput],
               arrival_times: dict[str, float], now: float) -> None:
        m = self.metrics
        if request_outputs:
            m.step_batch_size.observe(len(request_outputs))
        for out in request_outputs:
            arrival = arrival_times.get(out.request_id, now)
            seen = self._seen.setdefault(out.request_id, _Seen())
            new_tokens = 0
            for comp in out.outputs:
                count = len(comp.token_ids)
                new_tokens += count - seen.tokens_by_index.get(comp.index, 0)
                seen.tokens_by_index[comp.index] = count
            if new_tokens > 0:
                if seen.first_token_time is None:
                    m.time_to_first_token.observe(now - arrival)
                    m.prompt_tokens.inc(len(out.prompt_token_ids or ()))
                    seen.first_token_time = now
                else:
                    m.time_per_output_token.observe((now - seen.last_token_time) / new_tokens)
                m.generation_tokens.inc(new_tokens)
                seen.last_token_time = now
            if out.finished:
                self._seen.pop(out.request_id, None)
                m.e2e_request_latency.observe(now - arrival)
                reason = out.outputs[0].finish_reason if out.outputs else "abort"
                m.request_finished(str(reason))     # once per request, as vLLM counts
        stats = core_outputs.scheduler_stats
        if stats is not None:
            m.num_requests_running.set(float(getattr(stats, "num_running", 0)))
            m.num_requests_waiting.set(float(getattr(stats, "num_waiting", 0)))
            m.kv_cache_usage_perc.set(float(getattr(stats, "kv_cache_usage", 0.0)))

    def forget(self, request_ids: list[str]) -> None:
        """Requests that ended without a finished output (aborted, failed)."""
        for request_id in request_ids:
            self._seen.pop(request_id, None)
