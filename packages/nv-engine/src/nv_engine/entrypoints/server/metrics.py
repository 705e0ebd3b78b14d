"""Prometheus metrics with vLLM's names, one registry per server (several servers may share a process)."""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the app)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Bucket edges follow vLLM's choices for the same metrics.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """All metrics carry the label model_name, as vLLM's do."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["model_name"]
        self.num_requests_running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_cache_usage_perc = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", labels, registry=r)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", labels, registry=r)
        self.request_success = Counter(
            "vllm:request_success", "Finished requests.", labels + ["finished_reason"], registry=r)
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels,
            buckets=_TTFT_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "vllm:time_per_output_token_seconds", "Time per output token after the first.", labels,
            buckets=_TPOT_BUCKETS, registry=r)
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
            buckets=_E2E_BUCKETS, registry=r)
        # nv's own: requests that produced a token in one engine step (the continuous batch width)
        self.step_batch_size = Histogram(
            "nv:step_batch_size", "Requests that produced output in one engine step.", labels,
            buckets=_BATCH_BUCKETS, registry=r)
        self.model_name = model_name
        # bind the label once; the engine thread updates these every step
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                     "prompt_tokens", "generation_tokens", "time_to_first_token",
                     "time_per_output_token", "e2e_request_latency", "step_batch_size"):
            setattr(self, name, getattr(self, name).labels(model_name=model_name))

    def request_finished(self, finish_reason: str) -> None:
        self.request_success.labels(model_name=self.model_name, finished_reason=finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
