"""PrometheusStatLogger: the engine's metrics under vLLM's names, `vllm:` prefix included, so that dashboards
and KV-aware routers built on vLLM's metrics (llm-d's inference scheduler reads vllm:num_requests_waiting and
vllm:kv_cache_usage_perc) read nv unchanged; nv's own metrics are `nv:...`. In a registry of its own so
that several servers can live in one process. Bucket edges follow vLLM's for the same metrics.
Labels: model_name, engine."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from nv_engine.metrics.iteration_stats import IterationStats
from nv_kvcache import SchedulerStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                       10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")
MetricT = TypeVar("MetricT", bound=MetricWrapperBase)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class PrometheusStatLogger:
    """`record(scheduler_stats, iteration_stats)` once per engine step; `render()` for /metrics.

    SchedulerStats' counters are cumulative: each record adds what grew since the previous one (a
    snapshot smaller than the last, from a restarted scheduler, counts from zero). Every metric's
    label set is bound once here, so a record costs a few dict-free calls plus one observe per token
    latency.

    One logger per engine core: `for_engine(i)` gives the logger of core i of the same server (same
    registry and metric families, label engine="i")."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, *,
                 max_model_len: int = 131072, engine_index: int = 0,
                 families: dict[str, MetricWrapperBase] | None = None) -> None:
        """families: the metric families (by name) of the loggers of the other engines of one server,
        shared so that each metric is registered once (for_engine passes them)."""
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._families: dict[str, MetricWrapperBase] = {} if families is None else families
        names, values = ["model_name", "engine"], (model_name, str(engine_index))
        self._label_values = values
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return self._family(name, lambda: Gauge(name, doc, names, registry=r)).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return self._family(name, lambda: Counter(name, doc, names, registry=r)).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return self._family(name, lambda: Histogram(name, doc, names, buckets=buckets, registry=r)
                                ).labels(*values)

        # scheduler state
        self.num_requests_running = gauge("vllm:num_requests_running", "Number of requests in model execution "
                                          "batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be "
                                          "processed.")
        self.kv_cache_usage_perc = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of "
                                            "number of queried tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of "
                                         "cached tokens.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        # speculative decoding (0 without it)
        self.spec_decode_num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_decode_num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted "
                                                       "tokens.")
        # tokens
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per "
                                          "engine_step.", ITERATION_TOKEN_BUCKETS)
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens "
                                               "processed.", token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens", "Number of generation "
                                                   "tokens processed.", token_buckets)
        # requests
        success = self._family("vllm:request_success", lambda: Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"],
            registry=r))
        self._request_success = success
        self._request_success_by_reason = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        # latencies
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first "
                                             "token in seconds.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token "
                                             "latency in seconds.", INTER_TOKEN_BUCKETS)
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per "
            "request.", INTER_TOKEN_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request "
                                             "latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.request_queue_time = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in "
                                            "WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.request_inference_time = histogram("vllm:request_inference_time_seconds", "Histogram of time spent "
                                                "in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.request_prefill_time = histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in "
                                              "PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.request_decode_time = histogram("vllm:request_decode_time_seconds", "Histogram of time spent in "
                                             "DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self._cache_config_labels: tuple[str, ...] | None = None
        # SchedulerStats' cumulative counters -> the Counter each feeds, and the value last recorded
        self._cumulative: list[tuple[str, Counter]] = [
            ("prefix_cache_queries", self.prefix_cache_queries), ("prefix_cache_hits", self.prefix_cache_hits),
            ("num_preemptions", self.num_preemptions), ("num_draft_tokens", self.spec_decode_num_draft_tokens),
            ("num_accepted_tokens", self.spec_decode_num_accepted_tokens)]
        self._last_counts = dict.fromkeys([name for name, _ in self._cumulative], 0)

    def set_cache_config_info(self, *, block_size: int, num_gpu_blocks: int, kv_cache_dtype: str,
                              enable_prefix_caching: bool) -> None:
        """vllm:cache_config_info, a gauge set to 1 whose labels describe the KV cache (vLLM's info metric;
        cache_dtype is vLLM's label for the dtype, kv_cache_dtype nv's engine argument)."""
        name = "vllm:cache_config_info"
        info = self._family(name, lambda: Gauge(
            name, "Information of the LLMEngine CacheConfig",
            ["model_name", "engine", "block_size", "num_gpu_blocks", "cache_dtype", "kv_cache_dtype",
             "enable_prefix_caching"], registry=self.registry))
        if self._cache_config_labels is not None:    # this engine's previous values (not the others')
            info.remove(*self._cache_config_labels)
        labels = (*self._label_values, str(block_size), str(num_gpu_blocks), kv_cache_dtype, kv_cache_dtype,
                  str(bool(enable_prefix_caching)))
        info.labels(*labels).set(1)
        self._cache_config_labels = labels

    def _family(self, name: str, make: Callable[[], MetricT]) -> MetricT:
        """The metric family `name`, made (and registered) by the first engine's logger that asks."""
        found = self._families.get(name)
        if found is None:
            found = self._families[name] = make()
        return cast(MetricT, found)

    def for_engine(self, engine_index: int) -> PrometheusStatLogger:
        """The logger of engine core `engine_index` of the same server (its metrics labelled with it)."""
        return PrometheusStatLogger(self.model_name, self.registry, max_model_len=self.max_model_len,
                                    engine_index=engine_index, families=self._families)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if scheduler_stats is not None:
            self.num_requests_running.set(scheduler_stats.num_running)
            self.num_requests_waiting.set(scheduler_stats.num_waiting)
            self.kv_cache_usage_perc.set(scheduler_stats.kv_cache_usage)
            last_counts = self._last_counts
            for name, counter in self._cumulative:
                count, last = getattr(scheduler_stats, name), last_counts[name]
                if count != last:
                    counter.inc(count - last if count > last else count)
                    last_counts[name] = count
        if iteration_stats is None:
            return
        prompt, generation = iteration_stats.num_prompt_tokens, iteration_stats.num_generation_tokens
        if prompt:
            self.prompt_tokens.inc(prompt)
        if generation:
            self.generation_tokens.inc(generation)
        if prompt or generation:
            self.iteration_tokens.observe(prompt + generation)
        for ttft in iteration_stats.time_to_first_tokens_s:
            self.time_to_first_token.observe(ttft)
        observe_itl = self.inter_token_latency.observe
        for latency in iteration_stats.inter_token_latencies_s:
            observe_itl(latency)
        for done in iteration_stats.finished:
            self.request_success(done.finish_reason).inc()
            self.e2e_request_latency.observe(done.e2e_latency_s)
            self.request_queue_time.observe(done.queued_time_s)
            self.request_prefill_time.observe(done.prefill_time_s)
            self.request_decode_time.observe(done.decode_time_s)
            self.request_inference_time.observe(done.inference_time_s)
            self.request_prompt_tokens.observe(done.num_prompt_tokens)
            self.request_generation_tokens.observe(done.num_generation_tokens)
            if done.num_generation_tokens > 1:
                self.request_time_per_output_token.observe(done.decode_time_s / (done.num_generation_tokens - 1))

    def request_success(self, finish_reason: str) -> Counter:
        """vllm:request_success bound to this logger's labels and `finish_reason`."""
        success = self._request_success_by_reason.get(finish_reason)
        if success is None:       # a reason not bound ahead
            success = self._request_success_by_reason[finish_reason] = self._request_success.labels(
                *self._label_values, finish_reason)
        return success

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
