"""The FastAPI app of `nv serve`: OpenAI routes, /health, /metrics, /tokenize, /detokenize, /version,
/ping; CORS."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from nv_engine.engine.async_llm import AsyncLLM
from nv_engine.entrypoints.server.chat import create_chat_completion
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.completions import create_completion
from nv_engine.entrypoints.server.engine_loop import AsyncEngine
from nv_engine.entrypoints.server.errors import APIError, install_error_handlers
from nv_engine.entrypoints.server.guard import RequestGuard
from nv_engine.entrypoints.server.limits import ServerLimits
from nv_engine.entrypoints.server.loop_lag import LoopLagWatcher
from nv_engine.entrypoints.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from nv_engine.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from nv_engine.entrypoints.server.serving import ServerState
from nv_engine.entrypoints.server.stat_logger import ServerStatLogger
from nv_engine.entrypoints.server.utility_routes import UtilityRoutes


def build_state(engine: Any, *, tokenizer: Any, sampling_params_cls: type, model_path: str,
                max_model_len: int, served_model_names: list[str] | None = None,
                api_key: str | None = None, max_n: int = 128,
                chat_template: str | None = None, limits: ServerLimits | None = None,
                default_sampling: dict[str, float | int] | None = None,
                chat_parsing: ChatParsingOptions | None = None) -> ServerState:
    """Serve an AsyncLLM (what `nv serve` runs: the engine core in its own process), or an
    in-process LLMEngine-like object (add_request / step / abort_request / has_unfinished_requests)
    stepped by a thread of this process (AsyncEngine).
    default_sampling: sampling values for requests that leave them unset (generation config)."""
    names = served_model_names or [model_path]
    if isinstance(engine, AsyncLLM):
        config = engine.config
        metrics = ServerMetrics(names[0], max_model_len=max_model_len, log_stats=not config.disable_log_stats,
                                num_engines=len(engine.core_num_blocks))
        for index, num_blocks in enumerate(engine.core_num_blocks):
            metrics.set_cache_config_info(block_size=config.block_size, num_gpu_blocks=num_blocks,
                                          kv_cache_dtype=str(getattr(config, "kv_cache_dtype", "auto")),
                                          enable_prefix_caching=config.enable_prefix_caching, engine_index=index)
        engine.stat_loggers.append(ServerStatLogger(metrics))
        served: AsyncLLM | AsyncEngine = engine
    else:
        metrics = ServerMetrics(names[0], max_model_len=max_model_len, log_stats=False)
        served = AsyncEngine(engine, metrics)
    return ServerState(engine=served, tokenizer=tokenizer,
                       sampling_params_cls=sampling_params_cls, served_model_names=names,
                       model_path=model_path, max_model_len=max_model_len, max_n=max_n,
                       metrics=metrics, api_key=api_key, chat_template=chat_template,
                       limits=limits or ServerLimits(), default_sampling=dict(default_sampling or {}),
                       chat_parsing=chat_parsing or ChatParsingOptions())


def create_app(state: ServerState, *, cors: dict[str, Any] | None = None, root_path: str = "") -> FastAPI:
    """`cors`: CORSMiddleware's keywords (allow_origins, allow_methods, allow_headers,
    allow_credentials), None for no CORS headers; `root_path`: the path prefix a proxy adds."""
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        server_logger = logging.getLogger("nv_engine.entrypoints.server")
        watcher = LoopLagWatcher(server_logger) if server_logger.isEnabledFor(logging.DEBUG) else None
        if watcher is not None:
            watcher.start()          # the stream timeline's last hop (DEBUG: where tokens wait)
        try:
            yield
        finally:
            if watcher is not None:
                watcher.stop()
            state.engine.shutdown()

    app = FastAPI(title="nv", lifespan=lifespan, root_path=root_path)
    if cors is not None:
        app.add_middleware(CORSMiddleware, **cors)
    app.state.nv = state
    install_error_handlers(app)
    # auth and body size before any parsing. A middleware added before it (inside it) must leave body messages
    # as they are: a streamed response sends them past it (EventStreamResponse).
    app.add_middleware(RequestGuard, state=state)

    v1 = APIRouter(prefix="/v1")

    @v1.get("/models")
    async def list_models() -> JSONResponse:
        cards = [ModelCard(id=name, root=state.model_path, max_model_len=state.max_model_len)
                 for name in state.served_model_names]
        return JSONResponse(ModelList(data=cards).model_dump())

    @v1.post("/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Any:
        return await create_completion(state, req, raw)

    @v1.post("/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Any:
        return await create_chat_completion(state, req, raw)

    app.include_router(v1)
    app.include_router(UtilityRoutes(state).router)   # RequestGuard checks its API key

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine serves; with several engine cores (data parallel) 200 while one does,
        its JSON body naming the dead ones ({"dead_engines": {"1": "why"}}); 503 when none serves."""
        engine = state.engine
        dead = engine.dead_engines if isinstance(engine, AsyncLLM) and len(engine.core_pids) > 1 else None
        if engine.is_alive:
            if dead is None:
                return Response(status_code=200)
            return JSONResponse({"status": "degraded" if dead else "ok",
                                 "dead_engines": {str(index): reason for index, reason in dead.items()}})
        if dead:
            raise APIError(f"The engine is not running: every engine core died ("
                           f"{'; '.join(f'engine {i}: {why}' for i, why in dead.items())}).", status=503)
        raise APIError("The engine is not running.", status=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = state.metrics.render() if state.metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


def begin_drain(state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
    """SIGTERM: new /v1 requests get a 503 at once; requests in flight may finish within
    `limits.shutdown_timeout_s`, then the rest end (streams with an error event and [DONE]).
    Safe to call from any thread (a signal handler)."""
    def start() -> None:
        if state.draining:
            return
        state.draining = True
        loop.call_later(state.limits.shutdown_timeout_s, state.engine.fail_all_requests,
                        APIError("The server is shutting down.", status=503))

    loop.call_soon_threadsafe(start)
