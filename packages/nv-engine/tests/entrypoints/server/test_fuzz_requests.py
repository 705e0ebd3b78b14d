"""Generated request bodies against a live server: whatever a client sends, the answer is a 200 or
an OpenAI 4xx error (never a 500, never a hang), and the engine still gives the same greedy answer."""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

MODEL = "tiny"
ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=96, max_num_seqs=16,
                     num_gpu_blocks_override=96, block_size=16)
GREEDY = {"model": MODEL, "prompt": "The quick brown fox", "temperature": 0, "max_tokens": 8}
FUZZ_BUDGET_S = 60.0


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path):
    engine = create_engine(str(tiny_model_dir), **ENGINE_KWARGS)
    args = SimpleNamespace(model=str(tiny_model_dir), served_model_name=[MODEL], api_key=None, max_n=4)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=20) as http:
        reference = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
        yield SimpleNamespace(http=http, engine=engine, reference=reference)
    engine.shutdown()


text = st.text(max_size=24)          # any code point, lone surrogates included
numbers = st.one_of(st.none(), st.integers(-3, 6), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-2**70, 2**70))
token_ids = st.lists(st.integers(-3, 600), max_size=12)
common = {
    "model": st.sampled_from([MODEL, "other", None, 7]),
    "n": st.one_of(st.integers(-1, 5), numbers),
    "max_tokens": st.one_of(st.integers(-2, 4), st.sampled_from([None, 10**9, "4"])),
    "temperature": numbers, "top_p": numbers, "top_k": numbers, "min_p": numbers, "seed": numbers,
    "presence_penalty": numbers, "frequency_penalty": numbers, "repetition_penalty": numbers,
    "min_tokens": numbers, "stop": st.one_of(st.none(), text, st.lists(text, max_size=4)),
    "stop_token_ids": st.one_of(st.none(), token_ids), "ignore_eos": st.booleans(),
    "stream": st.booleans(), "stream_options": st.sampled_from([None, {"include_usage": True}, {}, 3]),
    "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(),
    "unknown_field": st.one_of(st.none(), text),
}
completion = st.fixed_dictionaries({}, optional={
    **common, "prompt": st.one_of(text, st.lists(text, max_size=3), token_ids,
                                  st.lists(token_ids, max_size=3), st.integers(), st.none()),
    "logprobs": st.one_of(st.none(), st.integers(-1, 25)), "echo": st.booleans()})
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", ""]),
                                 "content": st.one_of(text, st.none(), st.just([{"type": "text", "text": "hi"}]),
                                                      st.just([{"type": "image_url"}]))})
chat = st.fixed_dictionaries({"messages": st.one_of(st.lists(message, max_size=3), text)}, optional={
    **common, "max_completion_tokens": st.one_of(st.none(), st.integers(-1, 4)),
    "logprobs": st.booleans(), "top_logprobs": st.one_of(st.none(), st.integers(-1, 25)),
    "add_generation_prompt": st.booleans(), "continue_final_message": st.booleans(),
    "chat_template_kwargs": st.one_of(st.none(), st.just({"enable_thinking": False}),
                                      st.just({"chat_template": "{{ 1 }}"}), text)})
bodies = st.one_of(st.tuples(st.just("/v1/completions"), completion),
                   st.tuples(st.just("/v1/chat/completions"), chat))


def _post(http, path: str, body: dict) -> httpx.Response:
    if body.get("max_tokens") is None and "max_completion_tokens" not in body and path.endswith("chat/completions"):
        body = {**body, "max_tokens": 3}      # keep generated requests short: this is about parsing
    raw = json.dumps(body, allow_nan=True).encode("utf-8", errors="surrogatepass")
    return http.post(path, content=raw, headers={"Content-Type": "application/json"})


def test_generated_requests_never_500(server):
    started = time.monotonic()
    seen = {"ok": 0, "rejected": 0}

    @settings(max_examples=500, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(bodies)
    def one(case):
        path, body = case
        if time.monotonic() - started > FUZZ_BUDGET_S:
            return
        r = _post(server.http, path, body)
        # 404: an unknown model name; every other refusal is a 400
        assert r.status_code in (200, 400, 404), (r.status_code, r.text[:300], body)
        if r.status_code in (400, 404):
            assert r.json()["error"]["type"] == "invalid_request_error"
            seen["rejected"] += 1
            return
        seen["ok"] += 1
        if body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]")
            assert '"internal_error"' not in r.text, r.text[:300]

    one()
    assert seen["ok"] >= 10 and seen["rejected"] >= 100, seen   # both paths exercised
    assert sum(seen.values()) >= 500, f"only {seen} requests in {FUZZ_BUDGET_S:g} s"
    r = server.http.post("/v1/completions", json=GREEDY)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == server.reference
