"""What the completion and chat handlers share: server state, request checks, sampling parameters,
per-choice streaming bookkeeping, and logprob formatting."""
from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from nv_engine.engine.async_llm import AsyncLLM
from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.engine.output_stream import OutputStream
from nv_engine.entrypoints.server.batch_tokenizer import BatchTokenizer
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.engine_loop import AsyncEngine
from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.limits import ServerLimits
from nv_engine.entrypoints.server.metrics import ServerMetrics
from nv_engine.entrypoints.server.protocol import (
    ChatLogprobs,
    ChatLogprobToken,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    SamplingRequest,
    TopLogprob,
)
from nv_engine.structured_output.params import StructuredOutputsParams

_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                    "ignore_eos", "max_tokens", "min_tokens", "logprobs", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
                    "bad_words", "prompt_logprobs", "structured_outputs")

# which data-parallel engine core served a request (vLLM has no standard field for it)
ENGINE_INDEX_HEADER = "x-nv-engine-index"


@dataclass
class ServerState:
    """What every handler shares, and the request checks that depend on it."""

    engine: AsyncLLM | AsyncEngine     # AsyncLLM under `nv serve`; AsyncEngine: an LLMEngine in process
    tokenizer: Any
    sampling_params_cls: type
    served_model_names: list[str]
    model_path: str
    max_model_len: int
    max_n: int = 128
    metrics: ServerMetrics | None = None
    api_key: str | None = None
    chat_template: str | None = None   # --chat-template; None: the tokenizer's
    limits: ServerLimits = field(default_factory=ServerLimits)
    draining: bool = False           # SIGTERM: new /v1 requests get a 503
    # the checkpoint's generation-config sampling defaults (EngineConfig.default_sampling_params):
    # temperature, top_p, top_k, min_p, repetition_penalty for requests that leave them unset
    default_sampling: dict[str, float | int] = field(default_factory=dict)
    # --enable-auto-tool-choice, --tool-call-parser, --reasoning-parser
    chat_parsing: ChatParsingOptions = field(default_factory=ChatParsingOptions)
    # prompt texts, tokenized off the event loop in one thread, many at a time (None: no tokenizer)
    batch_tokenizer: BatchTokenizer | None = None
    # chat templates render in these two threads: Jinja holds the interpreter lock, so more threads would
    # only queue behind each other, and the event loop behind them
    template_threads: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="nv-chat-template"))

    def __post_init__(self) -> None:
        if self.batch_tokenizer is None and self.tokenizer is not None:
            self.batch_tokenizer = BatchTokenizer(self.tokenizer)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> str:
        """The name to answer with; unknown names are a 404."""
        if name is None or name in self.served_model_names:
            return self.model_name if name is None else name
        raise APIError(f"The model `{name}` does not exist. Served: {', '.join(self.served_model_names)}.",
                       status=404, param="model", code="model_not_found")

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt text (checked first: length, valid Unicode), from the batch
        tokenizer's thread: the event loop keeps answering."""
        self.limits.check_prompt_text(text)
        if self.batch_tokenizer is None:
            raise APIError("This model has no tokenizer: send prompts as token ids.", param="prompt")
        return await self.batch_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def render_chat_template(self, render: Callable[[], str]) -> str:
        """`render()` (a chat template's rendering) in one of the template threads."""
        return await asyncio.get_running_loop().run_in_executor(self.template_threads, render)

    def check_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise APIError("The prompt is empty.", param="prompt")
        self.limits.check_prompt_tokens(len(token_ids))
        if len(token_ids) >= self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"request has {len(token_ids)} input tokens, leaving no room for output. Please reduce "
                f"the length of the input.", param="prompt", code="context_length_exceeded")

    def resolve_max_tokens(self, requested: int | None, prompt_len: int, param: str = "max_tokens") -> int:
        """The request's output budget: unset means "until the context is full" (as vLLM); the checkpoint's
        generation-config max_new_tokens, where it sets one, caps every request (vLLM's server-wide limit)."""
        room = self.max_model_len - prompt_len
        limit = self.default_sampling.get("max_tokens")
        if requested is None:
            return room if limit is None else max(0, min(room, int(limit)))
        if requested > room:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + requested} tokens ({prompt_len} in the input, {requested} in "
                f"the completion). Please reduce the length of the input or of the completion.",
                param=param, code="context_length_exceeded")
        return requested if limit is None else min(requested, int(limit))

    def check_request(self, req: SamplingRequest, num_prompts: int) -> None:
        """Checks that need no tokenizer: n, prompts x n, stop strings (cheap, so done first)."""
        if req.n > self.max_n:
            raise APIError(f"n must be at most {self.max_n}, got {req.n}.", param="n")
        self.limits.check_sequences(num_prompts, max(req.n, 1))
        self.limits.check_stop(_stop_list(req))

    def build_sampling_params(self, req: SamplingRequest, *, max_tokens: int, logprobs: int | None) -> Any:
        self.check_request(req, 1)
        if req.stream_options is not None and not req.stream:
            raise APIError("stream_options needs stream=true.", param="stream_options")
        stop = _stop_list(req)
        logit_bias = None
        if req.logit_bias is not None:
            try:
                logit_bias = {int(token): bias for token, bias in req.logit_bias.items()}
            except ValueError as exc:
                raise APIError(f"logit_bias keys must be token ids, got {list(req.logit_bias)}.",
                               param="logit_bias") from exc
        top_k = self._default("top_k", req, 0)
        kwargs: dict[str, object] = dict(
            n=req.n,
            temperature=self._default("temperature", req, 1.0),
            top_p=self._default("top_p", req, 1.0),
            top_k=0 if top_k == -1 else top_k,   # vLLM spells "off" as -1, nv as 0
            min_p=self._default("min_p", req, 0.0),
            seed=req.seed,
            stop=stop or None,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=self._default("repetition_penalty", req, 1.0),
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logit_bias=logit_bias,
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
        )
        if req.prompt_logprobs is not None:
            kwargs["prompt_logprobs"] = req.prompt_logprobs
        # -- structured outputs (response_format, structured_outputs, guided_*) --
        constraints = req.structured_outputs_fields()
        if len(constraints) > 1:
            raise APIError("Only one of response_format, structured_outputs and guided_* may constrain the "
                           f"output; got {', '.join(name for name, _ in constraints)}.", param=constraints[1][0])
        if constraints:
            name, fields = constraints[0]
            if not fields:
                raise APIError("response_format of type json_schema needs json_schema.schema.", param=name)
            try:
                kwargs["structured_outputs"] = StructuredOutputsParams(**fields)
            except (ValueError, TypeError) as exc:
                raise APIError(str(exc), param=name) from exc
        # -- end structured outputs --
        try:
            return self.sampling_params_cls(**kwargs)
        except (ValueError, TypeError, OverflowError) as exc:
            raise APIError(str(exc), param=guess_param(str(exc))) from exc

    def _default(self, name: str, req: SamplingRequest, fallback: float | int) -> float | int:
        """The request's value of a sampling field; unset (absent or null): the generation-config
        default, else `fallback` (vLLM's defaults)."""
        value = getattr(req, name)
        if value is not None and name in req.model_fields_set:
            return value
        return self.default_sampling.get(name, fallback)


def _stop_list(req: SamplingRequest) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def guess_param(message: str) -> str | None:
    """The sampling field an engine error message names, if any."""
    for name in sorted(_SAMPLING_FIELDS, key=len, reverse=True):
        if re.search(rf"\b{name}\b", message):
            return name
    return None


def engine_headers(stream: OutputStream) -> dict[str, str]:
    """The response header naming the engine core that serves each of the call's requests (in prompt
    order, comma-separated): `x-nv-engine-index: 1`. None when the engine does not say."""
    if stream.engine_indices is None:
        return {}
    return {ENGINE_INDEX_HEADER: ",".join(str(index) for index in stream.engine_indices)}


def engine_error(exc: BaseException) -> APIError:
    """Map an exception from adding a request to the engine to an HTTP error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return APIError(f"The engine is not running: {exc}", status=503)
    if isinstance(exc, (ValueError, TypeError)):
        return APIError(str(exc), param=guess_param(str(exc)))
    return APIError(f"Internal error: {exc!r}", status=500)


@dataclass
class ChoiceState:
    """What one choice has sent so far: the text and tokens so far, taken from cumulative outputs
    or built from delta ones (every delta output must be applied, in order)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict] | None = None
    sent_chars: int = 0
    sent_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    done: bool = False           # finish chunk sent

    def update(self, comp: Any, delta: bool = False) -> None:
        if delta:                            # this choice's own lists, extended
            self.text += comp.text
            self.token_ids.extend(comp.token_ids)
            if comp.logprobs is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(comp.logprobs)
        else:
            self.text = comp.text
            self.token_ids = comp.token_ids      # the engine hands over fresh lists each step
            self.logprobs = comp.logprobs
        if comp.finish_reason is not None:
            self.finish_reason = str(getattr(comp.finish_reason, "value", comp.finish_reason))
            self.stop_reason = comp.stop_reason

    def take_delta(self) -> tuple[str, int, int]:
        """(new text, first new token, end token) since the last call."""
        delta = self.text[self.sent_chars:]
        start, end = self.sent_tokens, len(self.token_ids)
        self.sent_chars = max(self.sent_chars, len(self.text))
        self.sent_tokens = end
        return delta, start, end


class LogprobFormatter:
    """Turns the engine's per-token {token_id: Logprob} dicts into OpenAI's shapes."""

    def __init__(self, tokenizer: Any) -> None:
        self._decode = lru_cache(maxsize=65536)(lambda tid: tokenizer.decode([tid]))

    def token_str(self, token_id: int, lp: Any) -> str:
        decoded = getattr(lp, "decoded_token", None)
        return decoded if decoded is not None else self._decode(token_id)

    def _top(self, entry: dict, k: int) -> list[tuple[int, Any]]:
        ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)
        return ranked[:k]

    def chat(self, token_ids: list[int], logprobs: list[dict] | None, k: int) -> ChatLogprobs:
        content = []
        for tid, entry in zip(token_ids, logprobs or (), strict=False):
            chosen = entry.get(tid)
            tok = self.token_str(tid, chosen)
            tops = [TopLogprob(token=(s := self.token_str(t, lp)), logprob=_finite(lp.logprob),
                               bytes=list(s.encode("utf-8"))) for t, lp in self._top(entry, k)]
            content.append(ChatLogprobToken(
                token=tok, logprob=_finite(chosen.logprob if chosen is not None else float("-inf")),
                bytes=list(tok.encode("utf-8")), top_logprobs=tops))
        return ChatLogprobs(content=content)

    def prompt(self, entries: list[dict | None] | None) -> PromptLogprobs | None:
        """The engine's RequestOutput.prompt_logprobs in vLLM's JSON shape."""
        if entries is None:
            return None
        return [None if entry is None else
                {str(t): PromptLogprob(logprob=_finite(lp.logprob), rank=lp.rank,
                                       decoded_token=self.token_str(t, lp)) for t, lp in entry.items()}
                for entry in entries]

    def completion(self, token_ids: list[int], logprobs: list[dict] | None, k: int,
                   text_offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        offset = text_offset
        for tid, entry in zip(token_ids, logprobs or (), strict=False):
            chosen = entry.get(tid)
            tok = self.token_str(tid, chosen)
            out.tokens.append(tok)
            out.token_logprobs.append(_finite(chosen.logprob) if chosen is not None else None)
            top: dict[str, float] = {}
            for t, lp in self._top(entry, k):   # best first; tokens that decode alike keep the best
                top.setdefault(self.token_str(t, lp), _finite(lp.logprob))
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(tok)
        return out


def _finite(x: float) -> float:
    # JSON has no -inf / NaN; OpenAI clients expect a number
    value = float(x)
    return value if math.isfinite(value) else -9999.0


async def wait_for_disconnect(receive: Any) -> None:
    """Returns when the client closes the connection (the body was read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(coro: Any, receive: Any, on_disconnect: Any) -> Any:
    """Await `coro`; if the client disconnects first, cancel it, call `on_disconnect()` (which
    aborts the engine requests) and raise APIError 499."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work in done:
        return work.result()
    try:
        await work
    except (asyncio.CancelledError, Exception):
        pass
    on_disconnect()
    raise APIError("The client disconnected.", status=499)
