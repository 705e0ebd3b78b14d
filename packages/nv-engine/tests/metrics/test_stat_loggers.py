"""The stat loggers a frontend calls once per engine step: PrometheusStatLogger (the vllm: metrics),
LoggingStatLogger (the periodic INFO line), RequestStatsTracker (per-request clocks -> IterationStats),
ServerMetrics (what nv serve exposes), and the nv_* logging setup of nv serve."""
from __future__ import annotations

import io
import logging
import re

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nv_engine.config.logging_config import LOGGER_NAMES, configure_logging  # noqa: E402
from nv_engine.entrypoints.server.metrics import ServerMetrics  # noqa: E402
from nv_engine.metrics import (  # noqa: E402
    FinishedRequestStats,
    IterationStats,
    LoggingStatLogger,
    PrometheusStatLogger,
    RequestStatsTracker,
)
from nv_engine.metrics.prometheus_stat_logger import buckets_1_2_5  # noqa: E402
from nv_kvcache import SchedulerStats  # noqa: E402


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def value(text: bytes, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples(text).items() if n == name and labels.items() <= dict(ls).items())


def finished(reason: str = "stop", prompt: int = 10, generation: int = 5) -> FinishedRequestStats:
    return FinishedRequestStats(reason, e2e_latency_s=2.0, queued_time_s=0.5, prefill_time_s=0.25,
                                decode_time_s=1.25, inference_time_s=1.5, num_prompt_tokens=prompt,
                                num_generation_tokens=generation)


def test_prometheus_logger_renders_what_it_recorded():
    logger = PrometheusStatLogger("m")
    logger.record(SchedulerStats(3, 2, 0.25, 100, 40, 1), IterationStats(
        num_prompt_tokens=10, num_generation_tokens=4, time_to_first_tokens_s=[0.03],
        inter_token_latencies_s=[0.02, 0.02, 0.5], finished=[finished("length")]))
    text = logger.render()
    assert value(text, "vllm:num_requests_running", model_name="m", engine="0") == 3
    assert value(text, "vllm:num_requests_waiting") == 2
    assert value(text, "vllm:kv_cache_usage_perc") == 0.25
    assert value(text, "vllm:prefix_cache_queries_total") == 100
    assert value(text, "vllm:prefix_cache_hits_total") == 40
    assert value(text, "vllm:num_preemptions_total") == 1
    assert value(text, "vllm:prompt_tokens_total") == 10 and value(text, "vllm:generation_tokens_total") == 4
    assert value(text, "vllm:request_success_total", finished_reason="length") == 1
    assert value(text, "vllm:request_success_total", finished_reason="stop") == 0
    assert value(text, "vllm:time_to_first_token_seconds_count") == 1
    assert value(text, "vllm:inter_token_latency_seconds_count") == 3
    assert value(text, "vllm:inter_token_latency_seconds_bucket", le="0.025") == 2      # vLLM's edges
    assert value(text, "vllm:iteration_tokens_total_sum") == 14
    for name, total in (("vllm:e2e_request_latency_seconds", 2.0), ("vllm:request_queue_time_seconds", 0.5),
                        ("vllm:request_prefill_time_seconds", 0.25), ("vllm:request_decode_time_seconds", 1.25),
                        ("vllm:request_inference_time_seconds", 1.5), ("vllm:request_prompt_tokens", 10),
                        ("vllm:request_generation_tokens", 5),
                        ("vllm:request_time_per_output_token_seconds", 1.25 / 4)):
        assert value(text, name + "_sum") == total, name
        assert value(text, name + "_count") == 1, name


def test_cumulative_scheduler_counters_become_increments():
    logger = PrometheusStatLogger("m")
    for queries, hits, preemptions in ((10, 0, 0), (30, 16, 2), (30, 16, 2), (50, 32, 3)):
        logger.record(SchedulerStats(0, 0, 0.0, queries, hits, preemptions), None)
    text = logger.render()
    assert value(text, "vllm:prefix_cache_queries_total") == 50
    assert value(text, "vllm:prefix_cache_hits_total") == 32
    assert value(text, "vllm:num_preemptions_total") == 3
    logger.record(SchedulerStats(0, 0, 0.0, 5, 0, 1), None)     # a new scheduler counts from zero again
    assert value(logger.render(), "vllm:prefix_cache_queries_total") == 55
    assert value(logger.render(), "vllm:num_preemptions_total") == 4


def test_speculative_decoding_counters(caplog):
    prometheus, logging_logger = PrometheusStatLogger("m"), LoggingStatLogger(interval_s=0.0)
    for drafted, accepted in ((0, 0), (30, 12), (60, 30)):
        stats = SchedulerStats(1, 0, 0.1, 0, 0, 0, num_draft_tokens=drafted, num_accepted_tokens=accepted)
        prometheus.record(stats, None)
        with caplog.at_level(logging.INFO, logger="nv_engine.metrics"):
            logging_logger.record(stats, None)
    assert value(prometheus.render(), "vllm:spec_decode_num_draft_tokens_total") == 60
    assert value(prometheus.render(), "vllm:spec_decode_num_accepted_tokens_total") == 30
    lines = [r.getMessage() for r in caplog.records if "SpecDecoding" in r.getMessage()]
    assert lines == ["SpecDecoding metrics: Draft acceptance rate: 40.0%, Accepted: 12 tokens, Drafted: 30 tokens",
                     "SpecDecoding metrics: Draft acceptance rate: 60.0%, Accepted: 18 tokens, Drafted: 30 tokens"]


def test_each_logger_has_its_own_registry_and_cache_info():
    a, b = PrometheusStatLogger("a"), PrometheusStatLogger("b")
    a.record(SchedulerStats(1, 0, 0.5, 0, 0, 0), None)
    assert value(b.render(), "vllm:num_requests_running") == 0
    a.set_cache_config_info(block_size=16, num_gpu_blocks=512, kv_cache_dtype="fp8_e4m3",
                            enable_prefix_caching=True)
    a.set_cache_config_info(block_size=16, num_gpu_blocks=256, kv_cache_dtype="auto", enable_prefix_caching=False)
    infos = {ls: v for (n, ls), v in samples(a.render()).items() if n == "vllm:cache_config_info"}
    [(labels, one)] = infos.items()        # re-setting replaces the labels
    assert one == 1 and dict(labels)["kv_cache_dtype"] == "auto" and dict(labels)["num_gpu_blocks"] == "256"
    assert buckets_1_2_5(100) == [1, 2, 5, 10, 20, 50, 100]


def test_logging_logger_line(caplog: pytest.LogCaptureFixture):
    logger = LoggingStatLogger(interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="nv_engine.metrics"):
        logger.record(SchedulerStats(2, 1, 0.5, 100, 0, 0), IterationStats(num_prompt_tokens=50))
        logger.record(SchedulerStats(2, 1, 0.5, 200, 75, 0), IterationStats(num_generation_tokens=8))
    lines = [r.getMessage() for r in caplog.records if r.name == "nv_engine.metrics"]
    assert len(lines) == 2 and all(r.levelno == logging.INFO for r in caplog.records)
    assert "Avg prompt throughput" in lines[0] and "Running: 2 reqs, Waiting: 1 reqs" in lines[0]
    assert "GPU KV cache usage: 50.0%" in lines[1]
    assert "Prefix cache hit rate: 75.0%" in lines[1]            # 75 hits of the 100 queries since line 1


def test_logging_logger_waits_for_its_interval(caplog: pytest.LogCaptureFixture):
    logger = LoggingStatLogger(interval_s=3600.0)
    with caplog.at_level(logging.DEBUG, logger="nv_engine.metrics"):
        for _ in range(100):
            logger.record(SchedulerStats(1, 0, 0.1, 0, 0, 0), IterationStats(num_generation_tokens=1))
    assert not [r for r in caplog.records if r.name == "nv_engine.metrics"]
    with pytest.raises(ValueError, match="interval_s"):
        LoggingStatLogger(interval_s=-1)


def test_tracker_turns_outputs_into_iteration_stats():
    tracker = RequestStatsTracker()
    tracker.add_request("a", num_prompt_tokens=7, arrival_time=100.0)
    tracker.observe("a", 0, now=100.5, first_scheduled_time=100.5)      # scheduled, no token yet
    tracker.observe("a", 1, now=101.0)
    first = tracker.take_iteration_stats()
    assert (first.num_prompt_tokens, first.num_generation_tokens, first.time_to_first_tokens_s) == (7, 1, [1.0])
    tracker.observe("a", 2, now=102.0)
    tracker.observe("a", 1, "length", now=102.5)
    tracker.observe("a", 1, now=103.0)                 # finished: ignored
    second = tracker.take_iteration_stats()
    assert second.num_prompt_tokens == 0 and second.num_generation_tokens == 3
    assert second.inter_token_latencies_s == [0.5, 0.5, 0.5]      # one per token gap: two, then one
    assert second.finished == [FinishedRequestStats("length", 2.5, 0.5, 0.5, 1.5, 2.0, 7, 4)]
    tracker.add_request("b", 3, arrival_time=200.0)
    tracker.observe("b", 0, "abort", now=201.0)        # aborted before its first token
    assert tracker.take_iteration_stats().finished == [FinishedRequestStats("abort", 1.0, 0.0, 0.0, 0.0, 0.0, 3, 0)]
    assert len(tracker) == 0


def test_server_metrics_record_and_direct_updates():
    metrics = ServerMetrics("srv", log_stats=False)
    metrics.record(SchedulerStats(4, 0, 0.75, 10, 5, 0), IterationStats(num_generation_tokens=3))
    metrics.request_finished("stop")
    metrics.generation_tokens.inc(2)
    metrics.step_batch_size.observe(4)
    text = metrics.render()
    assert value(text, "vllm:num_requests_running", model_name="srv") == 4
    assert value(text, "vllm:generation_tokens_total") == 5
    assert value(text, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(text, "nv:step_batch_size_count") == 1
    names = [family.name for family in text_string_to_metric_families(text.decode())]
    assert len(names) == len(set(names))
    assert {n for n in names if not n.startswith("vllm:")} <= {"nv:step_batch_size", "nv:step_batch_size_created"}


@pytest.fixture
def restore_nv_loggers():
    saved = {name: (logging.getLogger(name).level, logging.getLogger(name).propagate,
                    list(logging.getLogger(name).handlers)) for name in LOGGER_NAMES}
    yield
    for name, (level, propagate, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers


@pytest.mark.usefixtures("restore_nv_loggers")
def test_configure_logging_format_and_level(monkeypatch: pytest.MonkeyPatch):
    out = io.StringIO()
    logging.getLogger().setLevel(logging.WARNING)      # a program's root setup does not hide nv's INFO lines
    monkeypatch.delenv("NV_LOGGING_LEVEL", raising=False)
    configure_logging(stream=out)
    configure_logging(stream=out)                      # idempotent: one handler, one line per record
    logging.getLogger("nv_engine.some.module").info("engine ready: %d blocks", 12)
    logging.getLogger("nv_kvcache").debug("hidden at INFO")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert re.fullmatch(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[test_stat_loggers\.py:\d+\] engine ready: 12 blocks",
                        lines[0]), lines[0]
    monkeypatch.setenv("NV_LOGGING_LEVEL", "debug")
    configure_logging(stream=out)
    logging.getLogger("nv_kvcache").debug("shown at DEBUG")
    assert out.getvalue().splitlines()[-1].endswith("shown at DEBUG")
    monkeypatch.setenv("NV_LOGGING_LEVEL", "chatty")
    with pytest.raises(ValueError, match="NV_LOGGING_LEVEL"):
        configure_logging(stream=out)
