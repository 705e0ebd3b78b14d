"""ServerMetrics: what `nv serve` exposes on /metrics (the PrometheusStatLogger's `vllm:` metrics, vLLM's
names, plus nv's own step batch width) and logs every 10 s (LoggingStatLogger), one registry per server
(several servers may share a process)."""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the app)
    CollectorRegistry,
    Histogram,
)

from nv_engine.metrics import IterationStats, LoggingStatLogger, PrometheusStatLogger
from nv_kvcache import SchedulerStats

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """`record(scheduler_stats, iteration_stats, engine_index)` once per step of an engine core feeds
    both loggers of that core (the `vllm:` metrics carry engine="<index>"; with several cores each
    logs its own line). The metric attributes below (bound to this server's labels, engine 0) are the
    PrometheusStatLogger's own, for code that updates a metric directly."""

    def __init__(self, model_name: str, *, max_model_len: int = 131072, log_stats: bool = True,
                 log_interval_s: float = 10.0, num_engines: int = 1) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.stat_logger = PrometheusStatLogger(model_name, self.registry, max_model_len=max_model_len)
        self.engine_stat_loggers = [self.stat_logger,
                                    *(self.stat_logger.for_engine(index) for index in range(1, num_engines))]
        self.logging_stat_loggers = [
            LoggingStatLogger(log_interval_s, engine_index=index if num_engines > 1 else None)
            for index in range(num_engines)] if log_stats else []
        self.logging_stat_logger = self.logging_stat_loggers[0] if log_stats else None
        # nv's own: requests that produced a token in one engine step (the continuous batch width)
        self.step_batch_size = Histogram(
            "nv:step_batch_size", "Requests that produced output in one engine step.", ["model_name"],
            buckets=_BATCH_BUCKETS, registry=self.registry).labels(model_name)
        logger = self.stat_logger
        self.num_requests_running = logger.num_requests_running
        self.num_requests_waiting = logger.num_requests_waiting
        self.kv_cache_usage_perc = logger.kv_cache_usage_perc
        self.prompt_tokens = logger.prompt_tokens
        self.generation_tokens = logger.generation_tokens
        self.time_to_first_token = logger.time_to_first_token
        self.time_per_output_token = logger.inter_token_latency     # one observation per token interval
        self.e2e_request_latency = logger.e2e_request_latency

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               engine_index: int = 0) -> None:
        self.engine_stat_loggers[engine_index].record(scheduler_stats, iteration_stats)
        if self.logging_stat_loggers:
            self.logging_stat_loggers[engine_index].record(scheduler_stats, iteration_stats)

    def set_cache_config_info(self, *, block_size: int, num_gpu_blocks: int, kv_cache_dtype: str,
                              enable_prefix_caching: bool, engine_index: int = 0) -> None:
        self.engine_stat_loggers[engine_index].set_cache_config_info(
            block_size=block_size, num_gpu_blocks=num_gpu_blocks, kv_cache_dtype=kv_cache_dtype,
            enable_prefix_caching=enable_prefix_caching)

    def request_finished(self, finish_reason: str) -> None:
        """Count one finished request (vllm:request_success{finished_reason})."""
        self.stat_logger.request_success(finish_reason).inc()

    def render(self) -> bytes:
        return self.stat_logger.render()
