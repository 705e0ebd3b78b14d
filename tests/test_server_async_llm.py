"""`nv serve` on AsyncLLM (the engine core in its own process), on CPU with a tiny random Qwen3:
streams work, a client that leaves frees its blocks in the core, and when the core process is
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
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


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


def test_killing_the_core_mid_stream(client, server):
    stream = client.completions.create(model=MODEL, prompt="Count with me", max_tokens=240, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices
    os.kill(server.llm.core_pid, signal.SIGKILL)
    with pytest.raises(openai.APIError):        # the error event ends the stream
        for _ in stream:
            pass
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
