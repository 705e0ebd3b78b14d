"""`nv serve --data-parallel-size 2`: two engine cores (processes) behind one frontend, on CPU with a tiny
random Qwen3, driven by the openai client. Every answer has the greedy tokens one engine gives; a request
whose prompt shares a long prefix with an earlier one lands on the core that cached it (the
x-nv-engine-index header names the core); /metrics labels every `vllm:` metric by engine; killing one
core fails only its requests, /health names it and the other core answers on; killing the last turns
/health 503 and ends the server. One server for the module; the kill tests come last."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from nv_engine import LLM, SamplingParams  # noqa: E402
from nv_engine.config.engine_args import EngineArgs  # noqa: E402
from nv_engine.engine.prefix_index import PrefixIndex  # noqa: E402
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_async_llm  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402
from nv_kvcache import BlockManager, Sequence  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny"
BLOCK = 16
ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=32,
                     num_gpu_blocks_override=128, block_size=BLOCK)
HEADER = "x-nv-engine-index"


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path) -> Iterator[SimpleNamespace]:
    llm = create_async_llm(str(tiny_qwen3_dir), data_parallel_size=2, **ENGINE_KWARGS)
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=[MODEL], api_key=None, max_n=4)
    app = build_app_for_engine(llm, args)
    try:
        with serve_in_thread(app) as url:
            app.state.server.exit_when_engine_dies = True      # as `nv serve` runs it
            app.state.server.engine_death_grace_s = 1.0
            yield SimpleNamespace(url=url, llm=llm, uvicorn=app.state.server)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def client(server: SimpleNamespace) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def complete(client: openai.OpenAI, prompt: list[int], max_tokens: int = 6) -> tuple[int, str, int]:
    """(the core that served it, the greedy text, prompt tokens found in that core's prefix cache)."""
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                      temperature=0, extra_body={"ignore_eos": True})
    body = raw.parse()
    assert body.usage.completion_tokens == max_tokens
    cached = body.usage.prompt_tokens_details.cached_tokens if body.usage.prompt_tokens_details else 0
    return int(raw.headers[HEADER]), body.choices[0].text, cached or 0


def test_every_answer_has_the_greedy_tokens_of_one_engine(client, tiny_qwen3_dir):
    prompts = [[(11 * i + j) % 300 + 1 for j in range(5 + i % 9)] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda p: complete(client, p, 8), prompts))
    offline = LLM(str(tiny_qwen3_dir), **ENGINE_KWARGS)
    try:
        expected = offline.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                                    use_tqdm=False)
    finally:
        offline.shutdown()
    assert [text for _, text, _ in served] == [e.outputs[0].text for e in expected]
    assert {core for core, _, _ in served} == {0, 1}           # both cores answered


def test_a_shared_prefix_lands_on_the_core_that_cached_it(client):
    # two long prefixes (4 full blocks each), each sent first to whichever core the balance picks;
    # every later prompt that starts with one of them goes to the core that computed it, although
    # the cores take turns for prompts with nothing cached
    prefixes = [[20 + (i * 7 + j) % 200 for j in range(4 * BLOCK)] for i in range(2)]
    home = [complete(client, prefixes[0] + [1])[0]]
    home.append(complete(client, prefixes[1] + [2])[0])
    assert home[0] != home[1]                                  # equal loads: the cores take turns
    for round_ in range(2):
        for which in (1, 0):
            core, _, cached = complete(client, prefixes[which] + [3 + round_, 4])
            assert core == home[which]
            assert cached >= 3 * BLOCK                          # the core had computed the prefix
    fresh = [complete(client, [250 - i, 9, 8, 7])[0] for i in range(2)]
    assert sorted(fresh) == [0, 1]                              # a miss goes to the cores in turn


def test_metrics_label_every_core(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    complete(client, [5, 6, 7])
    text = httpx.get(server.url + "/metrics", timeout=10).text
    generated: dict[str, float] = {}
    info: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:generation_tokens_total":
                generated[sample.labels["engine"]] = sample.value
            if sample.name == "vllm:cache_config_info":
                info[sample.labels["engine"]] = sample.labels["num_gpu_blocks"]
    assert set(generated) == {"0", "1"} and all(value > 0 for value in generated.values())
    assert info == {"0": "128", "1": "128"}
    health = httpx.get(server.url + "/health", timeout=5)
    assert health.status_code == 200 and health.json() == {"status": "ok", "dead_engines": {}}


def _stream_on(server: SimpleNamespace, core: int) -> Iterator[str]:
    """A long streamed completion that the dispatcher sent to `core` (other cores get fillers)."""
    for attempt in range(4):
        body = {"model": MODEL, "prompt": [40 + attempt, 41, 42], "max_tokens": 240, "stream": True,
                "ignore_eos": True, "temperature": 0}
        http = httpx.Client(timeout=60)
        response = http.send(http.build_request("POST", server.url + "/v1/completions", json=body), stream=True)
        if int(response.headers[HEADER]) == core:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))    # it is running
            deadline = time.monotonic() + 10         # the fillers' aborts reach the dispatcher
            while sum(server.llm.client.load()) > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            return lines
        response.close()
        http.close()
    raise AssertionError(f"no request went to core {core}")


def test_killing_one_core_leaves_the_other_answering(server, client):
    lines = _stream_on(server, 1)
    assert [complete(client, [70 + i, 71])[0] for i in range(2)] == [0, 0]    # the least loaded core
    os.kill(server.llm.core_pids[1], signal.SIGKILL)
    rest = "\n".join(lines)
    assert "engine is not running" in rest and rest.rstrip().endswith("data: [DONE]")   # a 503 error event
    deadline = time.monotonic() + 10
    while 1 not in server.llm.dead_engines and time.monotonic() < deadline:
        time.sleep(0.05)
    health = httpx.get(server.url + "/health", timeout=5)
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and list(health.json()["dead_engines"]) == ["1"]
    assert [complete(client, [60 + i, 61])[0] for i in range(4)] == [0, 0, 0, 0]
    assert not server.llm.errored and not server.uvicorn.should_exit


def test_killing_the_last_core_ends_the_server(server, client):
    os.kill(server.llm.core_pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    health = None
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health", timeout=5)
        if health.status_code == 503:
            break
        time.sleep(0.05)
    assert health is not None and health.status_code == 503
    assert "engine 0" in health.text and "engine 1" in health.text
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt="again", max_tokens=2)
    assert info.value.status_code == 503
    assert server.llm.errored
    deadline = time.monotonic() + 20            # the server exits so a supervisor restarts it
    while not server.uvicorn.should_exit and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.uvicorn.should_exit


def test_the_prefix_index_keys_are_the_block_managers_hashes():
    tokens = list(range(1, 2 * BLOCK + 5))
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = Sequence(tokens)
    index = PrefixIndex(BLOCK, capacity=3)
    assert index.block_hashes(tokens) == manager.block_hashes(seq, 2)   # full blocks only
    index.add(index.block_hashes(tokens))
    assert index.match_length(index.block_hashes(tokens[:BLOCK] + [999] * BLOCK)) == 1
    index.add(index.block_hashes([300] * 2 * BLOCK))                    # capacity 3: the oldest goes
    assert len(index) == 3 and index.match_length(index.block_hashes(tokens)) == 0


def test_data_parallel_size_is_checked_and_has_a_flag(tiny_qwen3_dir):
    import argparse

    with pytest.raises(ValueError, match="data_parallel_size must be a positive integer"):
        EngineArgs.from_kwargs(str(tiny_qwen3_dir), data_parallel_size=0).create_engine_config()
    parser = EngineArgs.add_cli_arguments(argparse.ArgumentParser())
    assert parser.parse_args(["-dp", "3"]).data_parallel_size == 3
    assert parser.parse_args(["--data-parallel-size", "2"]).data_parallel_size == 2


def test_an_in_process_engine_refuses_several_cores(tiny_qwen3_dir):
    with pytest.raises(ValueError, match="data_parallel_size=2"):
        LLM(str(tiny_qwen3_dir), data_parallel_size=2, **ENGINE_KWARGS)


def test_the_prometheus_loggers_of_two_engines_share_one_registry():
    from prometheus_client.parser import text_string_to_metric_families

    from nv_engine.metrics import IterationStats, PrometheusStatLogger
    from nv_kvcache import SchedulerStats

    first = PrometheusStatLogger("m")
    second = first.for_engine(1)
    for engine, logger in enumerate((first, second)):
        logger.set_cache_config_info(block_size=16, num_gpu_blocks=100 + engine, kv_cache_dtype="auto",
                                     enable_prefix_caching=True)
        logger.record(SchedulerStats(engine + 1, 0, 0.5, 0, 0, 0),
                      IterationStats(num_generation_tokens=10 * (engine + 1)))
    second.set_cache_config_info(block_size=16, num_gpu_blocks=7, kv_cache_dtype="auto", enable_prefix_caching=True)
    found: dict[tuple[str, str], float | str] = {}
    for family in text_string_to_metric_families(first.render().decode()):
        for sample in family.samples:
            if sample.name in ("vllm:num_requests_running", "vllm:generation_tokens_total"):
                found[sample.name, sample.labels["engine"]] = sample.value
            if sample.name == "vllm:cache_config_info":
                found[sample.name, sample.labels["engine"]] = sample.labels["num_gpu_blocks"]
    assert found == {("vllm:num_requests_running", "0"): 1, ("vllm:num_requests_running", "1"): 2,
                     ("vllm:generation_tokens_total", "0"): 10, ("vllm:generation_tokens_total", "1"): 20,
                     ("vllm:cache_config_info", "0"): "100", ("vllm:cache_config_info", "1"): "7"}
