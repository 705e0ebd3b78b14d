"""/tokenize, /detokenize, /version and /ping (vLLM's shapes), as one router."""
from __future__ import annotations

from fastapi import APIRouter, Response, params
from fastapi.responses import JSONResponse

from nv_engine.__about__ import __version__
from nv_engine.entrypoints.server.chat import render_chat_prompt
from nv_engine.entrypoints.server.completions import prompt_token_ids, split_prompts
from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)
from nv_engine.entrypoints.server.serving import ServerState


class UtilityRoutes:
    """The server's non-generating routes; `router` carries them (the API key check is the
    caller's: pass it as a router dependency)."""

    def __init__(self, state: ServerState, dependencies: list[params.Depends] | None = None) -> None:
        self.state = state
        self.router = APIRouter(dependencies=dependencies or [])
        self.router.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        self.router.add_api_route("/detokenize", self.detokenize, methods=["POST"])
        self.router.add_api_route("/version", self.version, methods=["GET"])
        self.router.add_api_route("/ping", self.ping, methods=["GET", "POST"])

    async def tokenize(self, req: TokenizeRequest) -> JSONResponse:
        """{prompt} or {messages} -> {count, max_model_len, tokens}."""
        self.state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError("Send exactly one of `prompt` and `messages`.", param="prompt")
        if req.messages is not None:
            ids = await render_chat_prompt(self.state, req, bool(req.add_special_tokens))
        else:
            add_special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = ((await prompt_token_ids(self.state, split_prompts(req.prompt), add_special))[0][1]
                   if req.prompt else [])
        return JSONResponse(TokenizeResponse(count=len(ids), max_model_len=self.state.max_model_len,
                                             tokens=ids).model_dump())

    async def detokenize(self, req: DetokenizeRequest) -> JSONResponse:
        """{tokens} -> {prompt}; ids outside the vocabulary are a 400."""
        self.state.check_model(req.model)
        vocab = len(self.state.tokenizer)
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(f"tokens outside the vocabulary (size {vocab}): {bad[:8]}", param="tokens")
        return JSONResponse(DetokenizeResponse(prompt=self.state.tokenizer.decode(req.tokens)).model_dump())

    async def version(self) -> JSONResponse:
        return JSONResponse(VersionResponse(version=__version__).model_dump())

    async def ping(self) -> Response:
        if self.state.engine.is_alive:
            return Response(status_code=200)
        raise APIError("The engine is not running.", status=503)
