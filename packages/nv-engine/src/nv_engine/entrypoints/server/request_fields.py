"""Every request field of /v1/completions and /v1/chat/completions (OpenAI's, plus vLLM's extras) and
what nv does with it, in one table. A field nv does not implement is accepted only absent, null or
at its OpenAI / vLLM default; any other value, and any field name not in the table, is a 400 that
names the field (never a silent drop).

The honoured fields are declared, typed, on protocol.py's request models; the others arrive in the
models' extra fields and are checked here.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from nv_engine.entrypoints.server.errors import APIError

COMPLETIONS = "completions"
CHAT = "chat"
_BOTH = frozenset({COMPLETIONS, CHAT})
_CHAT = frozenset({CHAT})
_COMPLETIONS = frozenset({COMPLETIONS})


class Treatment(enum.Enum):
    HONOURED = "honoured"          # takes effect (declared on the request model)
    IGNORED = "ignored"            # bookkeeping for the caller (user, metadata): any value, no effect
    DEFAULT_ONLY = "default_only"  # not implemented: only absent, null or an accepted default


@dataclass(frozen=True)
class RequestField:
    name: str
    treatment: Treatment
    endpoints: frozenset[str] = _BOTH
    accepted: tuple[Any, ...] = ()   # DEFAULT_ONLY: accepted values besides null
    # DEFAULT_ONLY: (value, the request model) -> accepted, for defaults that depend on other fields
    accepts: Callable[[Any, BaseModel], bool] | None = None

    def allows(self, value: Any, request: BaseModel) -> bool:
        if self.treatment is not Treatment.DEFAULT_ONLY or value is None:
            return True
        if self.accepts is not None and self.accepts(value, request):
            return True
        return any(type(value) is type(ok) and value == ok for ok in self.accepted)


def _honoured(names: str, endpoints: frozenset[str] = _BOTH) -> list[RequestField]:
    return [RequestField(n, Treatment.HONOURED, endpoints) for n in names.split()]


def _default_only(names: str, *accepted: Any, endpoints: frozenset[str] = _BOTH) -> list[RequestField]:
    return [RequestField(n, Treatment.DEFAULT_ONLY, endpoints, accepted) for n in names.split()]


_FIELDS: list[RequestField] = [
    # OpenAI, both endpoints
    *_honoured("model stream stream_options n max_tokens temperature top_p seed stop logprobs "
               "logit_bias presence_penalty frequency_penalty"),
    *[RequestField(n, Treatment.IGNORED) for n in ("user",)],
    # OpenAI, completions
    *_honoured("prompt echo", _COMPLETIONS),
    RequestField("best_of", Treatment.DEFAULT_ONLY, _COMPLETIONS, (1,),
                 accepts=lambda value, request: value == getattr(request, "n", 1)),
    *_default_only("suffix", "", endpoints=_COMPLETIONS),
    # OpenAI, chat
    *_honoured("messages max_completion_tokens top_logprobs", _CHAT),
    *[RequestField(n, Treatment.IGNORED, _CHAT)
      for n in ("metadata", "prompt_cache_key", "safety_identifier")],
    *_default_only("store", False, endpoints=_CHAT),
    *_honoured("parallel_tool_calls", _CHAT),
    *_honoured("tools tool_choice", _CHAT),
    *_default_only("functions", [], endpoints=_CHAT),          # the deprecated spelling of tools
    *_default_only("function_call", "none", endpoints=_CHAT),
    *_honoured("response_format"),
    *_default_only("modalities", ["text"], endpoints=_CHAT),
    *_default_only("service_tier", "auto", "default", endpoints=_CHAT),
    *_default_only("prompt_cache_retention", "in_memory", endpoints=_CHAT),
    *_default_only("audio prediction reasoning_effort verbosity web_search_options moderation "
                   "prompt_cache_options", endpoints=_CHAT),
    # vLLM's extras
    *_honoured("top_k min_p repetition_penalty min_tokens ignore_eos skip_special_tokens "
               "include_stop_str_in_output stop_token_ids allowed_token_ids bad_words "
               "add_special_tokens prompt_logprobs"),
    *_honoured("add_generation_prompt continue_final_message chat_template chat_template_kwargs",
               _CHAT),
    *_default_only("echo", False, endpoints=_CHAT),
    *_honoured("structured_outputs guided_json guided_regex guided_choice guided_grammar "
               "guided_decoding_backend"),
    *_default_only("truncate_prompt_tokens guided_whitespace_pattern logits_processors documents "
                   "mm_processor_kwargs cache_salt kv_transfer_params vllm_xargs"),
    *_default_only("return_tokens_as_token_ids return_token_ids use_beam_search", False),
    *_default_only("spaces_between_special_tokens", True),
    *_default_only("length_penalty", 1.0, 1),
    *_default_only("priority", 0),
]


class RequestFieldTable:
    """Lookup and check of the request fields above, per endpoint."""

    def __init__(self, fields: list[RequestField]) -> None:
        self._fields: dict[tuple[str, str], RequestField] = {}
        for f in fields:
            for endpoint in f.endpoints:
                if (endpoint, f.name) in self._fields:
                    raise ValueError(f"request field {f.name!r} is listed twice for {endpoint}")
                self._fields[(endpoint, f.name)] = f

    def get(self, endpoint: str, name: str) -> RequestField | None:
        return self._fields.get((endpoint, name))

    def names(self, endpoint: str, treatment: Treatment | None = None) -> set[str]:
        return {name for (ep, name), f in self._fields.items()
                if ep == endpoint and (treatment is None or f.treatment is treatment)}

    def check(self, endpoint: str, request: BaseModel) -> None:
        """APIError 400 for the first field the request model does not declare (its extra fields)
        that is unknown, or not implemented and not at its default."""
        for name, value in (request.model_extra or {}).items():
            field = self.get(endpoint, name)
            if field is None:
                raise APIError(f"Unknown field `{name}` for /v1/{_path(endpoint)}.", param=name,
                               code="unknown_field")
            if field.treatment is Treatment.HONOURED:   # declared on the model; here by mistake
                raise APIError(f"`{name}` could not be read.", status=500, param=name)
            if not field.allows(value, request):
                shown = " or ".join(json.dumps(v) for v in (None, *field.accepted))
                raise APIError(f"`{name}` is not supported by this server; send it absent or "
                               f"{shown} (got {json.dumps(value)}).", param=name, code="unsupported_field")


def _path(endpoint: str) -> str:
    return "chat/completions" if endpoint == CHAT else "completions"


REQUEST_FIELDS = RequestFieldTable(_FIELDS)
