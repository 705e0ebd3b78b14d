"""Metrics and KV-cache events of a real LLMEngine run (tiny Qwen3 on CPU): a 10-block cache forces
preemptions, a shared 32-token prefix gives prefix-cache hits. One run feeds both tests: the stat
loggers get what a frontend computes per step, and a ZMQ subscriber gets the KV-cache events."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")
pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nv_engine import LLMEngine, SamplingParams  # noqa: E402
from nv_engine.core.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch  # noqa: E402
from nv_engine.metrics import LoggingStatLogger, PrometheusStatLogger, RequestStatsTracker  # noqa: E402


@dataclass
class Run:
    engine: LLMEngine
    prometheus: PrometheusStatLogger
    outputs: dict[str, list[int]]
    frames: list[list[bytes]]
    final_cached: set[int]


@pytest.fixture(scope="module")
def run(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    endpoint = f"ipc://{tmp_path_factory.mktemp('kv_events')}/events"
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    subscriber.connect(endpoint)            # before the engine binds: no batch is missed
    engine = LLMEngine(model=str(tiny_qwen3_dir), num_gpu_blocks_override=10, block_size=16, max_model_len=160,
                       kv_events_config={"enable_kv_cache_events": True, "publisher": "zmq",
                                         "endpoint": endpoint, "topic": "kv-events"})
    time.sleep(0.3)                         # the subscription reaches the publisher
    prometheus = PrometheusStatLogger("tiny", max_model_len=160)
    prometheus.set_cache_config_info(block_size=16, num_gpu_blocks=engine.num_blocks, kv_cache_dtype="auto",
                                     enable_prefix_caching=True)
    logging_logger = LoggingStatLogger(interval_s=0.0)
    tracker = RequestStatsTracker()
    rng = random.Random(0)
    prefix = [rng.randrange(3, 300) for _ in range(32)]
    prompts = [prefix + [rng.randrange(3, 300) for _ in range(8 + i)] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True)
    outputs: dict[str, list[int]] = {}

    def add(i: int) -> None:
        engine.add_request(str(i), prompts[i], params)
        tracker.add_request(str(i), len(prompts[i]))

    def step() -> None:
        for out in engine.step():
            tokens = out.outputs[0].token_ids
            new = len(tokens) - len(outputs.get(out.request_id, ()))
            outputs[out.request_id] = list(tokens)
            tracker.observe(out.request_id, new, out.outputs[0].finish_reason if out.finished else None)
        stats, iteration = engine.get_stats(), tracker.take_iteration_stats()
        prometheus.record(stats, iteration)
        logging_logger.record(stats, iteration)

    add(0)
    step()
    step()                                  # request 0's prompt blocks are cached now
    for i in range(1, 4):
        add(i)
    while engine.has_unfinished_requests():
        step()
    final_cached = set(engine.scheduler.block_manager._hash_to_block)
    time.sleep(0.2)
    frames = []
    while subscriber.poll(200):
        frames.append(subscriber.recv_multipart())
    subscriber.close(linger=0)
    engine.shutdown()
    return Run(engine, prometheus, outputs, frames, final_cached)


def _samples(run: Run) -> dict[str, float]:
    text = run.prometheus.render().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + (f"[{sample.labels['finished_reason']}]" if "finished_reason" in sample.labels
                                 else "")
            if "le" not in sample.labels:
                values[key] = values.get(key, 0.0) + sample.value
    return values


def test_metrics_of_a_run_with_preemption_and_prefix_hits(run: Run):
    stats = run.engine.get_stats()
    assert stats.num_preemptions > 0, "a 10-block cache for 4 x ~80 tokens must preempt"
    assert stats.prefix_cache_hits >= 3 * 32
    values = _samples(run)
    assert values["vllm:num_preemptions_total"] == stats.num_preemptions
    assert values["vllm:prefix_cache_hits_total"] == stats.prefix_cache_hits
    assert values["vllm:prefix_cache_queries_total"] == stats.prefix_cache_queries
    assert values["vllm:generation_tokens_total"] == 4 * 36
    assert values["vllm:prompt_tokens_total"] == sum(32 + 8 + i for i in range(4))
    assert values["vllm:request_success_total[length]"] == 4
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                      "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert values[histogram + "_count"] == 4, histogram
    assert values["vllm:inter_token_latency_seconds_count"] == 4 * 35
    assert values["vllm:request_generation_tokens_sum"] == 4 * 36
    assert values["vllm:iteration_tokens_total_count"] > 0
    assert values["vllm:cache_config_info"] == 1
    assert values["vllm:num_requests_running"] == 0 and values["vllm:kv_cache_usage_perc"] == 0
    assert sorted(run.outputs) == ["0", "1", "2", "3"]


def test_kv_event_replay_gives_the_cached_blocks(run: Run):
    assert run.frames, "the subscriber received no KV-event batch"
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    cached: set[int] = set()
    kinds: set[type] = set()
    for number, (topic, seq, payload) in enumerate(run.frames):
        assert topic == b"kv-events" and int.from_bytes(seq, "big") == number   # none lost, in order
        batch = decoder.decode(payload)
        assert batch.ts > 0 and batch.data_parallel_rank is None
        for event in batch.events:
            kinds.add(type(event))
            if isinstance(event, BlockStored):
                assert event.block_size == 16 and event.medium == "GPU" and event.lora_id is None
                assert len(event.token_ids) == 16 * len(event.block_hashes)
                cached.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                cached.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                cached.clear()
    assert BlockStored in kinds and BlockRemoved in kinds     # the small cache evicted blocks
    assert cached == run.final_cached and cached
