"""The `args` of nv's Ray Serve application: `nv serve`'s flags plus the options of the deployment."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nv_engine.config.engine_config import DEFAULT_MAX_NUM_SEQS
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.cli import add_server_arguments
from nv_engine.entrypoints.server.limits import ServerLimits

# Keys that configure the Ray Serve deployment (passed to `Deployment.options`), not nv, with the type a
# string value (`serve run ... key=value`) is read as; Ray checks the values themselves.
DEPLOYMENT_OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "num_replicas": lambda text: text if text == "auto" else int(text),
    "autoscaling_config": json.loads, "ray_actor_options": json.loads,
    "max_ongoing_requests": int, "max_queued_requests": int,
    "health_check_period_s": float, "health_check_timeout_s": float,
    "graceful_shutdown_timeout_s": float, "graceful_shutdown_wait_loop_s": float}
DEPLOYMENT_OPTION_KEYS = frozenset(DEPLOYMENT_OPTION_TYPES)

# `nv serve` flags that Ray Serve owns under Ray: its proxy binds the address, the route prefix sets the path.
RAY_OWNED_FLAGS = {"host": "http_options.host", "port": "http_options.port", "root_path": "route_prefix",
                   "uvicorn_log_level": "Ray's logging_config"}


@dataclass(frozen=True)
class RayAppArgs:
    """What `build_app(args)` reads. `args` holds `nv serve`'s flags by name (underscores or dashes:
    `model`, `tensor_parallel_size`, `served_model_name`, `kv_events_config`, ...) with YAML values or the
    strings of `serve run ... key=value`, plus the deployment's options (DEPLOYMENT_OPTION_KEYS).

    Defaults: `ray_actor_options.num_gpus` = tensor_parallel_size (0 with device "cpu"): a replica's engine
    and its tensor-parallel workers run on that replica's GPUs, so one replica never spans machines;
    `max_ongoing_requests` = 2 x max_num_seqs, so a busy replica keeps a full batch plus a waiting queue
    and Ray routes the rest to other replicas."""

    server_args: argparse.Namespace      # what `nv serve` would have parsed from its command line
    deployment_options: dict[str, Any]   # keywords of `Deployment.options`

    @classmethod
    def from_builder_args(cls, args: Mapping[str, Any]) -> RayAppArgs:
        """ValueError naming the key for an unknown key, a flag Ray owns, or a value `nv serve` refuses."""
        nv_flags: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for key, value in args.items():
            name = str(key).replace("-", "_")
            if name in DEPLOYMENT_OPTION_KEYS:
                options[name] = RayAppArgs._option_value(name, value)
            elif name in RAY_OWNED_FLAGS:
                raise ValueError(f"{key!r} is set by Ray Serve ({RAY_OWNED_FLAGS[name]}), not by nv's args")
            else:
                nv_flags[name] = value
        server_args = cls._parse_server_args(nv_flags)
        try:   # the server's own checks, here so that `serve run` fails before any replica starts
            ServerLimits.from_cli_args(server_args)
            ChatParsingOptions.from_cli_args(server_args)
        except ValueError as exc:
            raise ValueError(f"nv on Ray Serve: {exc}") from exc
        if server_args.max_n < 1:
            raise ValueError("max_n must be at least 1")
        actor_options = dict(options.get("ray_actor_options") or {})
        if "num_gpus" not in actor_options:
            on_cpu = str(server_args.device or "").startswith("cpu")
            actor_options["num_gpus"] = 0 if on_cpu else server_args.tensor_parallel_size
        options["ray_actor_options"] = actor_options
        if "max_ongoing_requests" not in options:
            max_num_seqs = server_args.max_num_seqs or DEFAULT_MAX_NUM_SEQS
            options["max_ongoing_requests"] = 2 * max_num_seqs
        return cls(server_args=server_args, deployment_options=options)

    @staticmethod
    def _parse_server_args(flags: Mapping[str, Any]) -> argparse.Namespace:
        """`nv serve`'s parser over the flags, so each value is checked and converted as on the command line."""
        if "model" not in flags:
            raise ValueError("nv on Ray Serve needs `model` in its args (a local model dir or a hub id)")
        parser = argparse.ArgumentParser(prog="nv_engine.entrypoints.ray_serve:build_app", exit_on_error=False)
        add_server_arguments(parser)
        actions = {action.dest: action for action in parser._actions if action.option_strings}
        argv = [str(flags["model"])]
        for name, value in flags.items():
            if name == "model":
                continue
            action = actions.get(name)
            if action is None:
                raise ValueError(f"unknown arg {name!r} for nv on Ray Serve: use `nv serve`'s flag names "
                                 f"(underscores or dashes) or one of {sorted(DEPLOYMENT_OPTION_KEYS)}")
            argv += RayAppArgs._flag_argv(action, value)
        try:
            return parser.parse_args(argv)
        except argparse.ArgumentError as exc:
            raise ValueError(f"nv on Ray Serve: {exc}") from exc

    @staticmethod
    def _option_value(name: str, value: Any) -> Any:
        """A deployment option as Ray takes it: strings are read by the option's type, the rest passes as is."""
        if not isinstance(value, str):
            return value
        try:
            return DEPLOYMENT_OPTION_TYPES[name](value)
        except ValueError as exc:   # json.JSONDecodeError is a ValueError
            raise ValueError(f"{name}: cannot read {value!r}: {exc}") from exc

    @staticmethod
    def _flag_argv(action: argparse.Action, value: Any) -> list[str]:
        """One flag as command-line words: booleans as --x / --no-x, lists per nargs, mappings as JSON."""
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if action.nargs == 0:   # a switch: store_true, or --x / --no-x
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"   # `serve run ... key=true`
            if not isinstance(value, bool):
                raise ValueError(f"{action.dest!r} takes true or false, got {value!r}")
            if isinstance(action, argparse.BooleanOptionalAction):
                return [flag if value else "--no-" + flag[2:]]
            if value == action.const:
                return [flag]
            if value == action.default:
                return []
            raise ValueError(f"{action.dest!r} cannot be set to {value!r}")
        if value is None:
            return []
        if isinstance(value, list | tuple) and action.nargs in ("+", "*"):
            return [flag, *(str(item) for item in value)]
        if isinstance(value, dict | list | tuple):
            return [f"{flag}={json.dumps(value)}"]
        return [f"{flag}={value}"]   # `--x=VALUE`: a value that starts with "-" stays a value
