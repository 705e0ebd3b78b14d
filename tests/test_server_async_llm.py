"""`nv serve` on AsyncLLM (the engine core in its own process), on CPU with a tiny random Qwen3:
streams work, a client that leaves frees its blocks in the core, /metrics counts prefix hits, preemptions
and per-request latencies from the core's statistics, and when the core process is
killed mid-stream the stream ends with an error event, new requests get a 5xx, /health turns 503
and the server exits. One server for the module; the kill test comes last."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from nv_engine.entrypoints.server.cli import build_app_for_engine, create_async_llm  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny"
ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=32,
                     num_gpu_blocks_override=256, block_size=16)


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path):
    llm = create_async_llm(str(tiny_qwen3_dir), **ENGINE_KWARGS)
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=[MODEL], api_key=None, max_n=4)
    app = build_app_for_engine(llm, args)
    try:
        with serve_in_thread(app) as url:
            app.state.server.exit_when_engine_dies = True      # as `nv serve` runs it
            yield SimpleNamespace(url=url, llm=llm, uvicorn=app.state.server)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=180)


def _core_idle(server, timeout: float = 20.0) -> None:
    async def wait() -> None:
        llm = server.llm
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (await llm.call_utility("get_num_unfinished_requests") == 0
                    and await llm.call_utility("get_num_free_blocks") == llm.num_blocks):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the core still holds requests or blocks")

    asyncio.run(wait())


def test_streamed_and_plain_completions(client, server):
    plain = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert plain.usage.completion_tokens == 6
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=5, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5
    _core_idle(server)


def test_a_client_that_leaves_frees_its_blocks_in_the_core(server):
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 240, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", server.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break                        # one token seen: hang up
    _core_idle(server)


def _metric_values(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples}


def test_metrics_after_a_prefix_hit_and_a_forced_preemption(client, server):
    from concurrent.futures import ThreadPoolExecutor

    shared = list(range(10, 74))                              # 64 tokens: four full blocks to share
    for _ in range(2):                                        # the second finds the first's blocks
        client.completions.create(model=MODEL, prompt=shared, max_tokens=4, temperature=0)
    # 24 sequences of 48 + 200 tokens need 24 x 16 blocks; the core has 256: some must be preempted
    def long_request(i: int) -> int:
        out = client.completions.create(model=MODEL, prompt=[11 + i] * 48, max_tokens=200, temperature=0,
                                        extra_body={"ignore_eos": True})
        return out.usage.completion_tokens

    with ThreadPoolExecutor(24) as pool:
        assert list(pool.map(long_request, range(24))) == [200] * 24
    _core_idle(server)
    values = _metric_values(server.url)
    assert values["vllm:prefix_cache_hits_total"] >= 48     # 3 of 4 blocks: the last prompt token is recomputed
    assert values["vllm:prefix_cache_queries_total"] > values["vllm:prefix_cache_hits_total"]
    assert values["vllm:num_preemptions_total"] > 0
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds"):
        assert values[f"vllm:{histogram}_count"] >= 26, histogram
    assert values["vllm:generation_tokens_total"] >= 24 * 200 + 8


def test_killing_the_core_mid_stream(client, server):
    stream = client.completions.create(model=MODEL, prompt="Count with me", max_tokens=240, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices
    os.kill(server.llm.core_pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as event:   # the error event ends the stream
        for _ in stream:
            pass
    assert "engine is not running" in str(event.value)   # the 503 event, not a generic internal error
    deadline = time.monotonic() + 10
    health = None
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health", timeout=5).status_code
        if health == 503:
            break
        time.sleep(0.1)
    assert health == 503
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt="again", max_tokens=2)
    assert info.value.status_code == 503
    deadline = time.monotonic() + 20            # the server exits so a supervisor restarts it
    while not server.uvicorn.should_exit and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.uvicorn.should_exit
