"""Server mechanics against a scripted engine (no model): the engine thread, aborts on disconnect,
engine failure, and the SSE framing. The real engine drives tests/test_server.py."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from nv_engine.entrypoints.server.app import build_state, create_app  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402


class FakeParams:
    def __init__(self, **kw):
        if kw["temperature"] < 0:
            raise ValueError(f"temperature must be >= 0, got {kw['temperature']}")
        if kw["max_tokens"] < 1:
            raise ValueError(f"max_tokens must be >= 1, got {kw['max_tokens']}")
        self.__dict__.update(kw)


@dataclass
class FakeCompletion:
    index: int
    text: str = ""
    token_ids: list = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass
class FakeOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    outputs: list
    finished: bool
    num_cached_tokens: int = 0
    prompt_logprobs: list | None = None
    delta: bool = False        # cumulative outputs, whatever output_kind the server asks for


class FakeEngine:
    """Emits token (last + 1) % 50 per step; each token's text is "t<id> ". Thread-safety is checked:
    every call must come from one thread."""

    def __init__(self, step_delay: float = 0.002, fail_after: int | None = None):
        self.reqs: dict[str, tuple[list, FakeParams, list[FakeCompletion]]] = {}
        self.step_delay = step_delay
        self.fail_after = fail_after
        self.steps = 0
        self.aborted: list[str] = []
        self.threads: set[int] = set()
        self.scheduler = SimpleNamespace(num_running=0, num_waiting=0,
                                         block_manager=SimpleNamespace(usage=0.0))

    def _touch(self):
        self.threads.add(threading.get_ident())
        self.scheduler.num_running = len(self.reqs)
        self.scheduler.block_manager.usage = min(1.0, 0.01 * len(self.reqs))

    def add_request(self, request_id, prompt, params):
        ids = prompt["prompt_token_ids"]
        if any(t >= 50 for t in ids):
            raise ValueError("token id out of vocabulary")
        self.reqs[request_id] = (ids, params, [FakeCompletion(i) for i in range(params.n)])
        self._touch()

    def abort_request(self, request_id):
        self.aborted.append(request_id)
        self.reqs.pop(request_id, None)
        self._touch()

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def step(self):
        self.steps += 1
        if self.fail_after is not None and self.steps > self.fail_after:
            raise RuntimeError("boom")
        time.sleep(self.step_delay)
        outs = []
        for rid, (ids, params, comps) in list(self.reqs.items()):
            for c in comps:
                last = c.token_ids[-1] if c.token_ids else ids[-1]
                tok = (last + 1 + c.index) % 50
                c.token_ids.append(tok)
                c.text += f"t{tok} "
                if len(c.token_ids) >= params.max_tokens:
                    c.finish_reason = "length"
            finished = all(c.finish_reason for c in comps)
            outs.append(FakeOutput(rid, None, ids, [FakeCompletion(**vars(c)) for c in comps], finished))
            if finished:
                del self.reqs[rid]
        self._touch()
        return outs


class FakeTokenizer:
    chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) % 50 for ch in text]

    def decode(self, ids):
        return "".join(f"t{i} " for i in ids)

    def apply_chat_template(self, messages, tokenize=False, **kw):
        return "".join(m["content"] for m in messages)


def _serve(engine, **kw):
    state = build_state(engine, tokenizer=FakeTokenizer(), sampling_params_cls=FakeParams,
                        model_path="/fake", max_model_len=64, served_model_names=["fake"], **kw)
    return state, serve_in_thread(create_app(state))


def _events(resp) -> list:
    data = [line[len("data: "):] for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_streams_batch_in_one_engine_thread():
    engine = FakeEngine()
    state, server = _serve(engine)
    with server as url, httpx.Client(base_url=url, timeout=30) as client:
        def one(i):
            r = client.post("/v1/completions", json={"model": "fake", "prompt": "ab", "max_tokens": 5,
                                                     "stream": True, "n": 2})
            results[i] = _events(r)
        results = [None] * 8
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for events in results:
            text = {0: "", 1: ""}
            for ev in events:
                for ch in ev["choices"]:
                    text[ch["index"]] += ch["text"]
            assert text[0] == "".join(f"t{(ord('b') % 50 + k) % 50} " for k in range(1, 6))
            assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert len(engine.threads) == 1          # only the engine thread touched the engine
    assert state.engine.max_step_batch_size > 1


def test_client_disconnect_aborts_request():
    engine = FakeEngine(step_delay=0.01)
    state, server = _serve(engine)
    with server as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            with client.stream("POST", "/v1/completions",
                               json={"prompt": "ab", "max_tokens": 60, "stream": True}) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        break          # leave after the first event
        deadline = time.monotonic() + 10
        while engine.reqs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.reqs and len(engine.aborted) == 1
        # non-streaming: the client times out, the server aborts
        with httpx.Client(base_url=url, timeout=0.1) as client:
            with pytest.raises(httpx.TimeoutException):
                client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 60})
        deadline = time.monotonic() + 10
        while (engine.reqs or len(engine.aborted) < 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.reqs and len(engine.aborted) == 2


def test_engine_errors_are_400_and_engine_failure_is_reported():
    engine = FakeEngine(fail_after=3)
    state, server = _serve(engine)
    with server as url, httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/v1/completions", json={"prompt": [1, 2, 99], "max_tokens": 2})
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "ab", "temperature": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                      "max_tokens": 10, "stream": True})
        events = _events(r)
        assert events[-1]["error"]["type"] == "internal_error"
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json={"prompt": "ab"})
        assert r.status_code == 503 and r.json()["error"]["message"]
