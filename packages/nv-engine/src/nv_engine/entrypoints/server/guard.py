"""The ASGI layer in front of the routes: draining, authentication, body size, the in-flight bound,
and an OpenAI error body for anything a handler did not expect.

It runs before FastAPI reads or parses the body, so a request without a valid key or with an
oversized body costs the server neither the read nor the parse."""
from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.serving import ServerState
from nv_engine.entrypoints.server.sse_response import BODY_SEND_KEY

logger = logging.getLogger("nv_engine.entrypoints.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
# Routes behind the API key (as vLLM: the OpenAI routes and the tokenizer endpoints).
_AUTHENTICATED_PREFIXES = ("/v1", "/tokenize", "/detokenize")


class RequestGuard:
    """ASGI middleware; once `state.draining` is set (SIGTERM) new /v1 requests get a 503."""

    def __init__(self, app: ASGIApp, *, state: ServerState) -> None:
        self.app = app
        self.state = state
        self._api_key = state.api_key.encode("utf-8") if state.api_key else None
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        root_path: str = scope.get("root_path", "")
        if root_path and path.startswith(root_path):   # behind a proxy (--root-path)
            path = path[len(root_path):]
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        started = False
        # A streamed response sends its body chunks here, past tracked_send and the wrappers inside it
        # (EventStreamResponse): only the response start matters to them.
        scope[BODY_SEND_KEY] = send

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            if path.startswith(_AUTHENTICATED_PREFIXES):
                if self.state.draining:
                    raise APIError("The server is shutting down.", status=503)
                self._check_api_key(scope)
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                receive = await self._buffer_body(scope, receive)
            if path in _GENERATION_PATHS:
                if self.in_flight >= self.state.limits.max_in_flight_requests:
                    raise self.state.limits.too_many_in_flight()
                self.in_flight += 1
                try:
                    await self.app(scope, receive, tracked_send)
                finally:
                    self.in_flight -= 1
            else:
                await self.app(scope, receive, tracked_send)
        except APIError as err:
            if not started:
                await _send_json(send, err.status, err.body())
        except Exception as exc:   # a bug: the client gets an OpenAI error body, the log one line
            logger.error("request %s %s failed: %r", request_id, path, exc)
            logger.debug("request %s traceback", request_id, exc_info=True)
            if not started:
                err = APIError(f"Internal server error (request id {request_id}).", status=500)
                await _send_json(send, 500, err.body())

    def _check_api_key(self, scope: Scope) -> None:
        if self._api_key is None:
            return
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self._api_key):
            raise APIError("Invalid or missing API key (send `Authorization: Bearer KEY`).",
                           status=401, code="invalid_api_key")

    async def _buffer_body(self, scope: Scope, receive: Receive) -> Receive:
        """Read the body up to the limit (413 from Content-Length, or as soon as a chunked body
        passes it); the app then reads it from memory, and later messages (disconnect) pass on."""
        limit = self.state.limits.max_request_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise APIError("Invalid Content-Length header.") from None
                if declared > limit:
                    raise self.state.limits.body_too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":      # disconnected before the body was complete
                raise APIError("The client disconnected.", status=499)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise self.state.limits.body_too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


async def _send_json(send: Send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
