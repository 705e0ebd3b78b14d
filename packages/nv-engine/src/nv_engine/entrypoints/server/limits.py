"""What one deployment lets a request ask for, and the checks that enforce it (400 / 413 / 429)."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from nv_engine.entrypoints.server.errors import APIError

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """Per-request and per-server bounds; every default is safe for a public endpoint.

    The body limit is enforced before the body is parsed; text limits before tokenization; the
    in-flight bound counts generation requests being served (beyond it: 429)."""

    # Each field's `nv serve` flag: metadata "help" ("{default}" is filled in); "flag" where it is not the
    # field's name with dashes; no "help": no flag.
    max_request_body_bytes: int = field(default=8 * MIB, metadata={
        "help": "larger bodies get a 413 before they are read (default {default})"})
    max_prompt_chars: int = field(default=1_000_000, metadata={
        "help": "characters of one prompt or message (default {default})"})
    max_prompt_tokens: int | None = field(default=None, metadata={
        "help": "tokens of one prompt (default: the model's context length)"})
    max_sequences_per_request: int = field(default=256, metadata={
        "help": "prompts x n of one request (default {default})"})
    max_stop_strings: int = field(default=64, metadata={"help": "stop strings of one request (default {default})"})
    max_stop_string_chars: int = field(default=256, metadata={
        "help": "characters of one stop string (default {default})"})
    max_in_flight_requests: int = field(default=2048, metadata={
        "help": "generation requests served at once; beyond it a 429 (default {default})"})
    trust_request_chat_template: bool = field(default=False, metadata={
        "help": "accept `chat_template` from requests (rendered in a sandboxed subprocess)"})
    chat_template_timeout_s: float = field(default=5.0, metadata={
        "flag": "--chat-template-timeout", "help": "seconds a request's chat template may render (default {default})"})
    chat_template_memory_bytes: int = 1024 * MIB
    shutdown_timeout_s: float = field(default=30.0, metadata={
        "flag": "--shutdown-timeout",
        "help": "on SIGTERM, seconds requests in flight may take to finish (default {default})"})

    def __post_init__(self) -> None:
        for name in ("max_request_body_bytes", "max_prompt_chars", "max_sequences_per_request",
                     "max_stop_strings", "max_stop_string_chars", "max_in_flight_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {self.max_prompt_tokens}")
        if self.chat_template_timeout_s <= 0 or self.shutdown_timeout_s < 0:
            raise ValueError("chat_template_timeout_s must be > 0 and shutdown_timeout_s >= 0")

    # ----------------------------------------------------------------------------- command line
    @staticmethod
    def _flag(name: str, meta: Mapping[str, str]) -> str:
        return meta.get("flag") or "--" + name.replace("_", "-")

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field that has a help text, in a "limits" group."""
        group = parser.add_argument_group("limits (per request and per server; defaults are safe for a public "
                                          "endpoint)")
        for f in fields(cls):
            if "help" not in f.metadata:
                continue
            flag, help_text = cls._flag(f.name, f.metadata), f.metadata["help"].format(default=f.default)
            if f.type in (bool, "bool"):
                group.add_argument(flag, action="store_true", help=help_text)
            else:
                kind = float if f.type in (float, "float") else int
                group.add_argument(flag, type=kind, default=f.default, help=help_text)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerLimits:
        """The limits a parsed command line set; attributes it lacks keep their defaults."""
        values = {}
        for f in fields(cls):
            if "help" in f.metadata:
                dest = cls._flag(f.name, f.metadata).removeprefix("--").replace("-", "_")
                values[f.name] = getattr(args, dest, f.default)
        return cls(**values)

    # ----------------------------------------------------------------------------- checks
    def body_too_large(self) -> APIError:
        return APIError(f"The request body is larger than {self.max_request_body_bytes} bytes.",
                        status=413, code="request_too_large")

    def check_text(self, text: str, param: str) -> None:
        """Text a request sends must be valid Unicode (a lone surrogate cannot be encoded)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise APIError(f"{param} is not valid Unicode: {exc.reason} at position {exc.start}.",
                           param=param, code="invalid_unicode") from exc

    def check_prompt_text(self, text: str, param: str = "prompt") -> None:
        if len(text) > self.max_prompt_chars:
            raise APIError(f"The prompt has {len(text)} characters; this server accepts at most "
                           f"{self.max_prompt_chars}.", param=param, code="prompt_too_long")
        self.check_text(text, param)

    def check_prompt_tokens(self, num_tokens: int) -> None:
        if self.max_prompt_tokens is not None and num_tokens > self.max_prompt_tokens:
            raise APIError(f"The prompt has {num_tokens} tokens; this server accepts at most "
                           f"{self.max_prompt_tokens}.", param="prompt", code="prompt_too_long")

    def check_sequences(self, num_prompts: int, n: int) -> None:
        if num_prompts * n > self.max_sequences_per_request:
            raise APIError(f"The request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} "
                           f"sequences; this server allows at most {self.max_sequences_per_request}.",
                           param="n")

    def check_stop(self, stop: list[str]) -> None:
        if len(stop) > self.max_stop_strings:
            raise APIError(f"The request has {len(stop)} stop strings; at most {self.max_stop_strings} "
                           f"are allowed.", param="stop")
        for s in stop:
            if len(s) > self.max_stop_string_chars:
                raise APIError(f"A stop string has {len(s)} characters; at most "
                               f"{self.max_stop_string_chars} are allowed.", param="stop")
            self.check_text(s, "stop")

    def too_many_in_flight(self) -> APIError:
        return APIError(f"The server is serving its limit of {self.max_in_flight_requests} requests; "
                        f"retry later.", status=429, code="too_many_requests", err_type="rate_limit_error")
