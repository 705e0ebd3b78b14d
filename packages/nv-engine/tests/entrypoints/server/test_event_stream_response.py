"""EventStreamResponse sends what Starlette's StreamingResponse sends (the same bytes on the wire, through the
whole middleware stack), its body chunks past the middleware send wrappers, and a client's disconnect still
ends the stream (its iterator's `finally`, which aborts the engine requests, runs)."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")

from fastapi.responses import StreamingResponse  # noqa: E402

from nv_engine.engine.outputs import CompletionOutput, RequestOutput  # noqa: E402
from nv_engine.entrypoints.server import stream_chunk_encoder  # noqa: E402
from nv_engine.entrypoints.server.app import build_state, create_app  # noqa: E402
from nv_engine.entrypoints.server.completions import _CompletionRun  # noqa: E402
from nv_engine.entrypoints.server.protocol import CompletionRequest  # noqa: E402
from nv_engine.entrypoints.server.sse_response import BODY_SEND_KEY, EventStreamResponse  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

PROMPT = [1, 2, 3]
TEXTS = ["Hello", ", wörld", ' "quoted" \\ ', "\n", "中文 🙂", "\u2028", "", "end"]


class _IdleEngine:
    """An in-process engine with nothing to run (the test route never adds a request)."""

    scheduler = SimpleNamespace(num_running=0, num_waiting=0, block_manager=SimpleNamespace(usage=0.0))

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        raise AssertionError("not used")

    def abort_request(self, request_id: str) -> None:
        pass

    def has_unfinished_requests(self) -> bool:
        return False

    def step(self) -> list:
        return []


class _Outputs:
    """An OutputStream stand-in: one delta output per wait, the last one finished."""

    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        for i, text in enumerate(TEXTS):
            finish = "length" if i == len(TEXTS) - 1 else None
            yield [RequestOutput("cmpl-t-0", None, PROMPT, [CompletionOutput(0, text, [10 + i], None, None, finish)],
                                 finished=finish is not None, delta=True)]


def _events() -> AsyncIterator[str]:
    req = CompletionRequest(model="m", prompt=PROMPT, stream=True, max_tokens=len(TEXTS),
                            stream_options={"include_usage": True})
    return _CompletionRun(SimpleNamespace(tokenizer=None), req, "m", "cmpl-t", [(None, PROMPT)]).events(_Outputs())


def _raw_post(url: str, path: str) -> bytes:
    """The response's bytes as they came off the socket (status line, headers, chunked body)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nOrigin: http://client.example\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _without_date(raw: bytes) -> bytes:
    return b"\r\n".join(line for line in raw.split(b"\r\n") if not line.lower().startswith(b"date:"))


def test_wire_bytes_match_starlettes_streaming_response(monkeypatch):
    monkeypatch.setattr(stream_chunk_encoder.time, "time", lambda: 1_800_000_000.5)
    state = build_state(_IdleEngine(), tokenizer=None, sampling_params_cls=dict, model_path="/m", max_model_len=64)
    app = create_app(state, cors={"allow_origins": ["*"]})
    headers = {"x-nv-engine-index": "0"}

    async def lean() -> EventStreamResponse:
        return EventStreamResponse(_events(), headers=headers)

    async def starlette() -> StreamingResponse:
        return StreamingResponse(_events(), media_type="text/event-stream", headers=headers)

    app.add_api_route("/v1/test/lean", lean, methods=["POST"])
    app.add_api_route("/v1/test/starlette", starlette, methods=["POST"])
    with serve_in_thread(app) as url:
        lean_raw, starlette_raw = _raw_post(url, "/v1/test/lean"), _raw_post(url, "/v1/test/starlette")
    assert lean_raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"access-control-allow-origin: *" in lean_raw          # the start went through CORS
    assert "中文 🙂".encode() in lean_raw and lean_raw.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert _without_date(lean_raw) == _without_date(starlette_raw)


def test_body_chunks_skip_the_wrappers_and_the_last_message_does_not():
    through_chain: list[dict] = []
    direct: list[dict] = []

    async def chain_send(message: Any) -> None:
        through_chain.append(message)

    async def direct_send(message: Any) -> None:
        direct.append(message)

    async def receive() -> dict:
        await asyncio.sleep(3600)      # the client stays
        return {"type": "http.disconnect"}

    async def events() -> AsyncIterator[str]:
        for event in ("data: a\n\n", "data: é\n\n"):
            yield event

    asyncio.run(EventStreamResponse(events())({BODY_SEND_KEY: direct_send}, receive, chain_send))
    assert [m["type"] for m in through_chain] == ["http.response.start", "http.response.body"]
    assert (b"content-type", b"text/event-stream; charset=utf-8") in through_chain[0]["headers"]
    assert through_chain[1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert direct == [{"type": "http.response.body", "body": b"data: a\n\n", "more_body": True},
                      {"type": "http.response.body", "body": "data: é\n\n".encode(), "more_body": True}]


def test_a_disconnect_ends_the_stream_and_runs_its_finally():
    sent: list[dict] = []
    state = {"finally": False, "events": 0}

    async def send(message: Any) -> None:
        sent.append(message)

    async def run() -> None:
        first_event = asyncio.Event()

        async def receive() -> dict:
            await first_event.wait()
            return {"type": "http.disconnect"}

        async def events() -> AsyncIterator[str]:
            try:
                while True:
                    state["events"] += 1
                    first_event.set()
                    yield "data: x\n\n"
                    await asyncio.sleep(0.01)
            finally:
                state["finally"] = True

        await asyncio.wait_for(EventStreamResponse(events())({}, receive, send), 10)

    asyncio.run(run())
    assert state["finally"] and state["events"] >= 1
    assert sent[0]["type"] == "http.response.start"
    assert all(m.get("more_body", True) for m in sent[1:])    # no final message after a disconnect


def test_an_iterator_error_propagates():
    async def send(message: Any) -> None:
        pass

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def events() -> AsyncIterator[str]:
        yield "data: x\n\n"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(EventStreamResponse(events())({}, receive, send))
