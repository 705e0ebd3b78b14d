"""`nv serve` end to end on CPU: the real engine on a tiny random Qwen3, the official openai client,
a server on a free loopback port in a background thread (one for the module)."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from server_process import stop_with_sigint, wait_until_healthy  # noqa: E402

from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

API_KEY = "test-key"
MODEL = "tiny"
MAX_MODEL_LEN = 256
ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=64,
                     num_gpu_blocks_override=512, block_size=16)
CHAT = [{"role": "user", "content": "Hello, world! How are you today?"}]


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path):
    engine = create_engine(str(tiny_qwen3_dir), **ENGINE_KWARGS)
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=[MODEL], api_key=API_KEY, max_n=4)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url:
        yield SimpleNamespace(url=url, state=app.state.nv, engine=engine)
    shutdown = getattr(engine, "shutdown", None)
    if callable(shutdown):
        shutdown()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


@pytest.fixture(scope="module")
def reference_llm(tiny_qwen3_dir: Path):
    from nv_engine import LLM

    return LLM(str(tiny_qwen3_dir), **ENGINE_KWARGS)


def _kv_usage(server) -> float:
    return server.engine.scheduler.block_manager.usage


def _wait_idle(server, timeout: float = 20.0) -> None:
    """Until the engine holds no request and no KV block (aborts are processed asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.engine.has_unfinished_requests() and _kv_usage(server) == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine not idle: unfinished={server.engine.has_unfinished_requests()} "
                         f"kv usage={_kv_usage(server)}")


def test_models_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200


def test_greedy_matches_llm_generate(client, reference_llm):
    from nv_engine import SamplingParams

    prompt = "The quick brown fox"
    ref = reference_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24),
                                 use_tqdm=False)[0].outputs[0]
    got = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24)
    assert got.choices[0].text == ref.text
    assert got.usage.completion_tokens == len(ref.token_ids)
    streamed = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ref.text

    ref_chat = reference_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24),
                                  use_tqdm=False)[0].outputs[0]
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=24)
    assert chat.choices[0].message.content == ref_chat.text
    assert chat.choices[0].message.role == "assistant"


def test_completion_n_stop_logprobs_max_tokens(client):
    base = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=20,
                                     extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert base.choices[0].finish_reason == "length" and base.usage.completion_tokens == 20
    stop = text[6:9]
    stopped = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=20,
                                        stop=[stop], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.index(stop)]

    many = client.completions.create(model=MODEL, prompt="Hello", n=3, temperature=1.0, seed=7,
                                     max_tokens=5, logprobs=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage.completion_tokens == 15
    for c in many.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
        assert all(lp_ <= 0 for lp_ in lp.token_logprobs)
        assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
        for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
            assert max(top.values()) >= chosen - 1e-6     # the top entries are the most likely
    greedy = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=6,
                                       logprobs=3, extra_body={"ignore_eos": True}).choices[0].logprobs
    for chosen, top in zip(greedy.token_logprobs, greedy.top_logprobs, strict=True):
        assert abs(max(top.values()) - chosen) < 1e-5     # greedy picks the top-1 token


def test_completion_batch_of_prompts_and_echo(client):
    out = client.completions.create(model=MODEL, prompt=["Hello", "Paged attention"], n=2, max_tokens=3,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in out.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]   # greedy: samples agree
    assert out.usage.completion_tokens == 12
    echoed = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                       echo=True, extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == "Hello" + by_index[0]


def test_chat_stream_shape_and_logprobs(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, temperature=0, max_completion_tokens=12, stream=True,
        stream_options={"include_usage": True}, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].logprobs]   # text may lag a cut char
    assert sum(len(c.choices[0].logprobs.content) for c in content) == 12
    assert all(len(t.top_logprobs) == 3 for c in content for t in c.choices[0].logprobs.content)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0,
                                           max_completion_tokens=12, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content


def test_64_concurrent_streams_batch_and_free_blocks(server):
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    async def one(i: int) -> tuple[str, str | None]:
        stream = await aclient.completions.create(
            model=MODEL, prompt=f"Request number {i}:", max_tokens=16, temperature=0.8, seed=i,
            stream=True, extra_body={"ignore_eos": True})
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def run_all():
        try:
            return await asyncio.gather(*(one(i) for i in range(64)))
        finally:
            await aclient.close()

    server.state.engine.max_step_batch_size = 0
    results = asyncio.run(run_all())
    assert len(results) == 64 and all(reason == "length" for _, reason in results)
    assert server.state.engine.max_step_batch_size > 1, "requests were not batched together"
    metrics = _metrics(server)
    hist = {s.labels["le"]: s.value for s in metrics["nv:step_batch_size"].samples
            if s.name.endswith("_bucket")}
    assert hist["+Inf"] > hist["1.0"]          # some engine step carried more than one request
    _wait_idle(server)


def test_disconnect_mid_stream_aborts_and_frees_blocks(server, http, monkeypatch):
    aborted = []
    real_abort = server.engine.abort_request
    monkeypatch.setattr(server.engine, "abort_request", lambda rid: (aborted.append(rid), real_abort(rid)))
    with http.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break
        assert _kv_usage(server) > 0           # the request holds blocks while it streams
    _wait_idle(server)
    assert len(aborted) == 1


def test_bad_requests_get_400_and_server_keeps_serving(server, http):
    chat = {"model": MODEL, "messages": CHAT}
    cases = [
        ("/v1/completions", {"model": MODEL, "prompt": [5] * (MAX_MODEL_LEN + 1)}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 5}, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": [10 ** 6]}, None),   # id outside the vocab
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True, "top_k": -7}, "top_k"),
        ("/v1/chat/completions", dict(chat, max_completion_tokens=10 ** 5), "max_completion_tokens"),
        ("/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=50), "top_logprobs"),
        ("/v1/chat/completions", dict(chat, messages=[]), "messages"),
        ("/v1/chat/completions", dict(chat, presence_penalty=9), "presence_penalty"),
    ]
    for path, body, param in cases:
        r = http.post(path, json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
        if param is not None:
            assert err["param"] == param, (body, err)
    r = http.post("/v1/completions", content=b'{"model": "tiny", "prompt": ',
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3,
                                            "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    _wait_idle(server)


def test_api_key_enforced(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert httpx.get(server.url + "/metrics").status_code == 200


def _metrics(server) -> dict:
    text = httpx.get(server.url + "/metrics").text
    return {fam.name: fam for fam in text_string_to_metric_families(text)}


def _value(families: dict, family: str, sample: str) -> float:
    return sum(s.value for s in families[family].samples if s.name == sample)


def test_metrics_parse_and_move(server, client):
    before = _metrics(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert before[name].type == "gauge"
    client.completions.create(model=MODEL, prompt="Count: 1 2 3", max_tokens=7,
                              extra_body={"ignore_eos": True})
    after = _metrics(server)
    assert _value(after, "vllm:generation_tokens", "vllm:generation_tokens_total") - \
        _value(before, "vllm:generation_tokens", "vllm:generation_tokens_total") == 7
    assert _value(after, "vllm:prompt_tokens", "vllm:prompt_tokens_total") > \
        _value(before, "vllm:prompt_tokens", "vllm:prompt_tokens_total")
    def finished_length(fams: dict) -> float:
        return sum(s.value for s in fams["vllm:request_success"].samples
                   if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "length")

    assert finished_length(after) == finished_length(before) + 1
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert _value(after, hist, hist + "_count") == _value(before, hist, hist + "_count") + 1


def test_nv_serve_command_line(tiny_qwen3_dir: Path):
    """`nv serve` as users start it: a subprocess on 127.0.0.1, one request, clean exit on SIGINT."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "nv_engine.entrypoints.cli", "serve", str(tiny_qwen3_dir), "--port", str(port),
           "--device", "cpu", "--max-model-len", "128", "--num-gpu-blocks-override", "64",
           "--served-model-name", "cli-model", "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NV_API_KEY": ""})
    try:
        # two interpreters start: the server and its engine core
        wait_until_healthy(proc, f"http://127.0.0.1:{port}", 120, lambda: proc.stdout.read())
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"model": "cli-model", "prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        stop_with_sigint(proc)
    assert proc.returncode == 0
