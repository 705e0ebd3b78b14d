"""Hostile requests against one live `nv serve` app (the tiny random model, in-process).

Every case checks what a user relies on: the bad request gets a clear 4xx (never a 500 with a
traceback), /health keeps answering within a second while it runs, and the next greedy answer is
the same as before."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from nv_engine.engine.outputs import Logprob  # noqa: E402
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

API_KEY = "sk-test"
MODEL = "tiny"
ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=16,
                     num_gpu_blocks_override=128, block_size=16)
GREEDY = {"model": MODEL, "prompt": "The quick brown fox", "temperature": 0, "max_tokens": 8}
LOOP_BOMB = ("{% for a in range(700) %}{% for b in range(700) %}{% for c in range(700) %}"
             "{% endfor %}{% endfor %}{% endfor %}")
STRING_BOMB = "{% set s = 'a' * 3000000000 %}{{ s }}"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path):
    engine = create_engine(str(tiny_model_dir), **ENGINE_KWARGS)
    args = SimpleNamespace(model=str(tiny_model_dir), served_model_name=[MODEL], api_key=API_KEY, max_n=4,
                           max_request_body_bytes=1024 * 1024, chat_template_timeout=2.0)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60,
                                                   headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        reference = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
        yield SimpleNamespace(url=url, http=http, state=app.state.nv, engine=engine, reference=reference,
                              uvicorn=app.state.server)
    engine.shutdown()


class HealthProbe:
    """Polls /health from its own thread while a bad request runs; records every latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as c:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    ok = c.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.monotonic() - t0 if ok else math.inf)
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        while not self.latencies:     # polling before the bad request starts
            time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def check_still_serving(server, probe: HealthProbe | None = None) -> None:
    if probe is not None:
        assert probe.latencies and probe.p99() < 1.0, f"/health p99 {probe.p99():.2f} s"
    r = server.http.post("/v1/completions", json=GREEDY)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == server.reference


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()["error"]
    assert body["message"] and "Traceback" not in body["message"]
    return body


def chat(content: str = "Hello", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
            "temperature": 0, **extra}


# ----------------------------------------------------------------------- 1. request chat templates
def test_request_chat_template_refused_by_default(server):
    r = server.http.post("/v1/chat/completions", json=chat(chat_template_kwargs={"chat_template": LOOP_BOMB}))
    assert error_of(r, 400)["param"] == "chat_template_kwargs.chat_template"
    assert "--trust-request-chat-template" in r.json()["error"]["message"]
    check_still_serving(server)


@pytest.fixture
def trusted_templates(server):
    before = server.state.limits
    server.state.limits = dataclasses.replace(before, trust_request_chat_template=True)
    yield
    server.state.limits = before


@pytest.mark.parametrize("template", [LOOP_BOMB, STRING_BOMB], ids=["nested-loops", "3GB-string"])
def test_trusted_template_bombs_are_bounded(server, trusted_templates, template):
    with HealthProbe(server.url) as probe:
        t0 = time.monotonic()
        r = server.http.post("/v1/chat/completions", json=chat(chat_template_kwargs={"chat_template": template}))
        elapsed = time.monotonic() - t0
    assert error_of(r, 400)["param"] == "chat_template_kwargs.chat_template"
    assert elapsed < 2.0 + 3.0
    check_still_serving(server, probe)


def test_trusted_template_renders(server, trusted_templates):
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    r = server.http.post("/v1/chat/completions", json=chat(chat_template_kwargs={"chat_template": template}))
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 3


# ----------------------------------------------------------------------- 2. sizes and counts
def test_50mb_body_is_413_and_server_keeps_answering(server):
    body = json.dumps({"model": MODEL, "prompt": "a" * (50 * 1024 * 1024), "max_tokens": 1})
    with HealthProbe(server.url) as probe:
        r = server.http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert error_of(r, 413)["code"] == "request_too_large"

    def chunks():          # no Content-Length: the limit applies while reading
        for _ in range(64):
            yield b"x" * (1024 * 1024)

    r = server.http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert error_of(r, 413)["code"] == "request_too_large"
    check_still_serving(server, probe)


def _raw_request(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(head)
        return s.recv(65536)


def test_auth_is_checked_before_the_body_is_read(server):
    # 200 MB announced, none sent: the 401 must come without waiting for the body
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200000000\r\n\r\n")
    t0 = time.monotonic()
    reply = _raw_request(server.url, head)
    assert reply.startswith(b"HTTP/1.1 401") and time.monotonic() - t0 < 2
    # the right key but an oversized announced body: 413 before reading it
    with_key = head.replace(b"Host: x\r\n", f"Host: x\r\nAuthorization: Bearer {API_KEY}\r\n".encode())
    reply = _raw_request(server.url, with_key)
    assert reply.startswith(b"HTTP/1.1 413")


def test_prompt_limits(server):
    r = server.http.post("/v1/completions", json={**GREEDY, "prompt": ["hi"] * 100, "n": 4})
    assert error_of(r, 400)["param"] == "n"                  # 400 sequences > 256
    r = server.http.post("/v1/completions", json={**GREEDY, "prompt": "a" * 1_000_001})
    assert error_of(r, 400)["code"] == "prompt_too_long"
    r = server.http.post("/v1/completions", json={**GREEDY, "prompt": "word " * 200})
    assert error_of(r, 400)["code"] == "context_length_exceeded"
    check_still_serving(server)


def test_20000_stop_strings_are_refused(server):
    stops = [f"stop-{i}" for i in range(20_000)]
    with HealthProbe(server.url) as probe:
        r = server.http.post("/v1/completions", json={**GREEDY, "stop": stops, "n": 4})
        r_long = server.http.post("/v1/completions", json={**GREEDY, "stop": ["x" * 10_000]})
    assert error_of(r, 400)["param"] == "stop" and error_of(r_long, 400)["param"] == "stop"
    check_still_serving(server, probe)


def test_in_flight_limit_is_429(server, monkeypatch):
    real_step = server.engine.step
    release = threading.Event()

    sent_a_token = threading.Event()

    def held_step():   # once a token went out, the request stays in flight until the second got its answer
        if sent_a_token.is_set():
            release.wait(10)
        outputs = real_step()
        if any(c.token_ids for out in outputs for c in out.outputs):
            sent_a_token.set()
        return outputs

    monkeypatch.setattr(server.engine, "step", held_step)
    before = server.state.limits
    server.state.limits = dataclasses.replace(before, max_in_flight_requests=1)
    try:
        with httpx.Client(base_url=server.url, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as other:
            with other.stream("POST", "/v1/completions", json={**GREEDY, "stream": True}) as stream:
                lines = stream.iter_lines()
                next(lines)
                r = server.http.post("/v1/completions", json=GREEDY)
                release.set()
                assert error_of(r, 429)["type"] == "rate_limit_error"
                assert "data: [DONE]" in list(lines)
    finally:
        release.set()
        server.state.limits = before
    monkeypatch.undo()
    check_still_serving(server)


# ----------------------------------------------------------------------- 5. exact answers
def test_lone_surrogate_is_400(server):
    for path, body in (("/v1/completions", {**GREEDY, "prompt": "hi \ud800 there"}),
                       ("/v1/chat/completions", chat("hi \ud800")),
                       ("/v1/completions", {**GREEDY, "stop": ["\udfff"]})):
        r = server.http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert error_of(r, 400)["code"] == "invalid_unicode", path
    check_still_serving(server)


def test_non_ascii_bearer_token_is_401(server):
    for token in ("ключ".encode(), b"sk-\xff\xfe"):
        r = httpx.post(server.url + "/v1/completions", json=GREEDY,
                       headers=[(b"Authorization", b"Bearer " + token)])
        assert error_of(r, 401)["code"] == "invalid_api_key"
    check_still_serving(server)


def test_non_finite_logprobs_are_minus_9999(server, monkeypatch):
    real_step = server.engine.step

    def nan_step():
        outputs = real_step()
        for out in outputs:
            for comp in out.outputs:
                for entry in comp.logprobs or ():
                    for tid, lp in list(entry.items()):
                        entry[tid] = Logprob(float("nan"), lp.rank, lp.decoded_token)
        return outputs

    monkeypatch.setattr(server.engine, "step", nan_step)
    r = server.http.post("/v1/completions", json={**GREEDY, "logprobs": 2})
    assert r.status_code == 200
    lps = r.json()["choices"][0]["logprobs"]
    assert lps["token_logprobs"] and all(v == -9999.0 for v in lps["token_logprobs"])
    assert all(v == -9999.0 for top in lps["top_logprobs"] for v in top.values())
    r = server.http.post("/v1/completions", json={**GREEDY, "logprobs": 2, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = [v for e in events for c in e["choices"] if c.get("logprobs")
                for v in c["logprobs"]["token_logprobs"]]
    assert streamed and all(v == -9999.0 for v in streamed)
    monkeypatch.undo()
    check_still_serving(server)


def test_unhandled_error_is_an_openai_500_with_one_log_line(server, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.state, "check_prompt", broken)
    with caplog.at_level(logging.ERROR, logger="nv_engine.entrypoints.server"):
        r = server.http.post("/v1/completions", json=GREEDY)
    body = error_of(r, 500)
    assert body["type"] == "internal_error" and "a bug" not in body["message"]
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 1 and "req-" in errors[0].getMessage() and errors[0].exc_info is None
    monkeypatch.undo()
    check_still_serving(server)


# ----------------------------------------------------------------------- 6. SIGTERM drains (last: ends the server)
def test_shutdown_drains_then_ends_streams_with_an_error_event(server, monkeypatch):
    real_step = server.engine.step

    def slow_step():
        time.sleep(0.05)
        return real_step()

    monkeypatch.setattr(server.engine, "step", slow_step)
    server.state.limits = dataclasses.replace(server.state.limits, shutdown_timeout_s=1.0)
    lines: list[str] = []
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        short = {**GREEDY, "max_tokens": 4, "stream": True}
        long = {**GREEDY, "max_tokens": 120, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=long) as long_stream, \
                c.stream("POST", "/v1/completions", json=short) as short_stream:
            long_lines = long_stream.iter_lines()
            next(long_lines)
            server.uvicorn.handle_exit(signal.SIGTERM, None)     # what the signal handler calls
            time.sleep(0.2)
            try:    # refused at the socket, or (a request already on a connection) a 503
                late = httpx.post(server.url + "/v1/completions", json=GREEDY, timeout=5,
                                  headers={"Authorization": f"Bearer {API_KEY}"})
                assert error_of(late, 503)
            except httpx.ConnectError:
                pass
            assert server.state.draining
            short_text = short_stream.read().decode()
            lines = [line for line in long_lines if line.startswith("data: ")]
    assert short_text.rstrip().endswith("data: [DONE]") and '"error"' not in short_text   # finished in time
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["type"] == "service_unavailable"
