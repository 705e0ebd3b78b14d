"""POST /v1/chat/completions: the tokenizer's chat template, then the same engine path."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.entrypoints.server.chat_output_parser import ChatOutputParser
from nv_engine.entrypoints.server.chat_output_plan import ChatOutputPlan
from nv_engine.entrypoints.server.chat_template_sandbox import ChatTemplateSandbox
from nv_engine.entrypoints.server.engine_loop import OutputStream
from nv_engine.entrypoints.server.errors import APIError, sse_error
from nv_engine.entrypoints.server.protocol import (
    SSE_DONE,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatStreamChoice,
    DeltaMessage,
    PromptTokensDetails,
    TokenizeRequest,
    UsageInfo,
    random_id,
    sse,
)
from nv_engine.entrypoints.server.request_fields import CHAT, REQUEST_FIELDS
from nv_engine.entrypoints.server.serving import (
    ChoiceState,
    LogprobFormatter,
    ServerState,
    engine_error,
    engine_headers,
    run_unless_disconnected,
)
from nv_engine.entrypoints.server.sse_response import EventStreamResponse
from nv_engine.entrypoints.server.stream_chunk_encoder import StreamChunkEncoder
from nv_engine.sampling_params import RequestOutputKind

logger = logging.getLogger("nv_engine.entrypoints.server")

MAX_TOP_LOGPROBS = 20   # OpenAI's bound
PROMPT_TAIL_TOKENS = 32  # the end of the prompt a reasoning parser looks at (the assistant turn's start)


def _message_dict(i: int, msg: ChatMessage) -> dict:
    d = msg.model_dump(exclude_none=True)
    if isinstance(msg.content, list):     # content parts: only text is supported
        texts = []
        for part in msg.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"Only text content parts are supported, got {part.get('type')!r}.",
                               param=f"messages.{i}.content")
            texts.append(part["text"])
        d["content"] = "\n".join(texts)
    for j, call in enumerate(msg.tool_calls or ()):   # templates read the arguments as an object
        try:
            d["tool_calls"][j] = call.template_dict()
        except ValueError as exc:
            raise APIError(str(exc), param=f"messages.{i}.tool_calls.{j}.function.arguments") from exc
    return d


def _request_template(req: ChatCompletionRequest | TokenizeRequest) -> tuple[str | None, str]:
    """(template the request supplies or None, the field that carried it)."""
    template = getattr(req, "chat_template", None)
    if template is not None:
        return template, "chat_template"
    kwargs = req.chat_template_kwargs or {}
    if "chat_template" in kwargs:
        return kwargs["chat_template"], "chat_template_kwargs.chat_template"
    return None, ""


async def render_chat_prompt(state: ServerState, req: ChatCompletionRequest | TokenizeRequest,
                             add_special_tokens: bool = False) -> list[int]:
    """The prompt token ids: the chat template's text (the request's template, the server's
    --chat-template or the tokenizer's), tokenized without extra special tokens by default.

    The server's or the model's template renders in a worker thread; a template from the request only
    when the server trusts request templates, and then in a sandboxed subprocess bounded in time and
    memory."""
    tok = state.tokenizer
    messages = [_message_dict(i, m) for i, m in enumerate(req.messages or ())]
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str):
            state.limits.check_prompt_text(m["content"], param=f"messages.{i}.content")
    kwargs = dict(req.chat_template_kwargs or {})
    template, field_name = _request_template(req)
    kwargs.pop("chat_template", None)
    if req.tools:
        kwargs["tools"] = [tool.model_dump(exclude_none=True) for tool in req.tools]
    add_generation_prompt = req.add_generation_prompt and not req.continue_final_message
    if template is not None:
        if not state.limits.trust_request_chat_template:
            raise APIError(f"{field_name} is not accepted: this server renders only the model's chat "
                           f"template (start it with --trust-request-chat-template to allow request "
                           f"templates).", param=field_name)
        if not isinstance(template, str):
            raise APIError(f"{field_name} must be a string.", param=field_name)
        text = await ChatTemplateSandbox(state.limits).render(
            template, messages, special_tokens=_special_tokens(tok),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=req.continue_final_message, kwargs=kwargs, param=field_name)
        return await state.encode(text, add_special_tokens=add_special_tokens)
    server_template = state.chat_template
    if server_template is None and not getattr(tok, "chat_template", None):
        raise APIError("The model's tokenizer has no chat template; use /v1/completions.",
                       param="messages")

    def render() -> str:
        try:
            return tok.apply_chat_template(
                messages, tokenize=False, chat_template=server_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=req.continue_final_message, **kwargs)
        except Exception as exc:   # a template error is the request's fault (bad roles, ...)
            raise APIError(f"Could not apply the chat template: {exc}", param="messages") from exc

    text = await state.render_chat_template(render)
    return await state.encode(text, add_special_tokens=add_special_tokens)


def _special_tokens(tok: Any) -> dict[str, str]:
    tokens = getattr(tok, "special_tokens_map", {}) or {}
    return {k: v for k, v in tokens.items() if isinstance(v, str)}


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, raw: Request) -> Any:
    model = state.check_model(req.model)
    REQUEST_FIELDS.check(CHAT, req)
    top_logprobs = None
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}.",
                       param="top_logprobs")
    if req.logprobs:
        top_logprobs = req.top_logprobs or 0
    elif req.top_logprobs:
        raise APIError("top_logprobs needs logprobs=true.", param="top_logprobs")
    if req.prompt_logprobs is not None and req.stream:
        raise APIError("prompt_logprobs is not supported with stream=true for chat completions.",
                       param="prompt_logprobs")
    state.check_request(req, 1)
    plan = ChatOutputPlan(req, state.chat_parsing)
    ids = await render_chat_prompt(state, req, req.add_special_tokens)
    state.check_prompt(ids)
    if req.max_completion_tokens is not None:
        max_tokens = state.resolve_max_tokens(req.max_completion_tokens, len(ids), param="max_completion_tokens")
    else:
        max_tokens = state.resolve_max_tokens(req.max_tokens, len(ids))
    params = plan.constrain(state.build_sampling_params(req, max_tokens=max_tokens, logprobs=top_logprobs))
    params.output_kind = RequestOutputKind.DELTA   # per output only what is new (ChoiceState adds up)
    prompt_tail = state.tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:])
    request_id = random_id("chatcmpl")
    try:
        stream = await state.engine.add_requests([(request_id, {"prompt_token_ids": ids}, params)],
                                                   stream=req.stream)
    except Exception as exc:
        raise engine_error(exc) from exc
    run = _ChatRun(state, req, model, request_id, len(ids), top_logprobs,
                   {i: plan.output_parser(prompt_tail) for i in range(req.n)})
    if req.stream:
        return EventStreamResponse(run.events(stream), headers=engine_headers(stream))
    body = await run_unless_disconnected(run.collect(stream), raw.receive, stream.abort)
    return JSONResponse(body, headers=engine_headers(stream))


class _ChatRun:
    def __init__(self, state: ServerState, req: ChatCompletionRequest, model: str, request_id: str,
                 num_prompt_tokens: int, top_logprobs: int | None, parsers: dict[int, ChatOutputParser]) -> None:
        self.req, self.model, self.id = req, model, request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.top_logprobs = top_logprobs
        self.fmt = LogprobFormatter(state.tokenizer)
        self.choices = {i: ChoiceState(i) for i in range(req.n)}
        self.parsers = parsers   # per choice: reasoning and tool calls out of the text
        self.num_cached_tokens = 0
        self.prompt_logprobs: list[dict | None] | None = None
        self.encoder = StreamChunkEncoder(request_id, model)
        self.continuous_usage = req.continuous_usage      # read per chunk

    def _apply(self, outputs: list[Any]) -> set[int]:
        changed = set()
        for out in outputs:
            self.num_cached_tokens = max(self.num_cached_tokens, out.num_cached_tokens)
            if out.prompt_logprobs is not None:
                self.prompt_logprobs = out.prompt_logprobs
            for comp in out.outputs:
                self.choices[comp.index].update(comp, out.delta)
                changed.add(comp.index)
        return changed

    def _usage(self) -> UsageInfo:
        completion = sum(len(c.token_ids) for c in self.choices.values())
        return UsageInfo(prompt_tokens=self.num_prompt_tokens, completion_tokens=completion,
                         total_tokens=self.num_prompt_tokens + completion,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=self.num_cached_tokens))

    def _logprobs(self, c: ChoiceState, start: int, end: int) -> Any:
        if self.top_logprobs is None:
            return None
        return self.fmt.chat(c.token_ids[start:end], (c.logprobs or [])[start:end], self.top_logprobs)

    def _chunk(self, choice: ChatStreamChoice | None, usage: UsageInfo | None = None) -> str:
        if choice is not None:
            # the choice's usage so far, as vLLM (continuous_usage_stats)
            so_far = ((self.num_prompt_tokens, len(self.choices[choice.index].token_ids))
                      if self.continuous_usage else None)
            delta = choice.delta
            if choice.logprobs is None and delta.tool_calls is None:     # the plain chunk, without pydantic
                return self.encoder.chat(choice.index, delta.role, delta.content, delta.reasoning,
                                         delta.reasoning_content, choice.finish_reason, choice.stop_reason, so_far)
            if so_far is not None:
                usage = UsageInfo(prompt_tokens=so_far[0], completion_tokens=so_far[1],
                                  total_tokens=so_far[0] + so_far[1])
        return sse(ChatCompletionChunk(id=self.id, model=self.model,
                                       choices=[choice] if choice else [], usage=usage))

    async def collect(self, stream: OutputStream) -> dict:
        async for outputs in stream:
            self._apply(outputs)
        choices = []
        for c in self.choices.values():
            message = self.parsers[c.index].message(c.text)
            choices.append(ChatChoice(index=c.index, message=message, logprobs=self._logprobs(c, 0, len(c.token_ids)),
                                      finish_reason=self.parsers[c.index].finish_reason(c.finish_reason, message),
                                      stop_reason=c.stop_reason))
        return ChatCompletionResponse(id=self.id, model=self.model, choices=choices, usage=self._usage(),
                                      prompt_logprobs=self.fmt.prompt(self.prompt_logprobs)).model_dump()

    async def events(self, stream: OutputStream) -> AsyncIterator[str]:
        try:
            for index in self.choices:   # the role comes first, once per choice
                yield self._chunk(ChatStreamChoice(
                    index=index, delta=DeltaMessage(role="assistant", content="")))
            # Every output queued since the last wait is applied at once: a choice gets one delta
            # with all its new text and tokens, and the chunks of one wait go out in one write.
            async for outputs in stream:
                events = []
                for index in sorted(self._apply(outputs)):
                    c = self.choices[index]
                    if c.done:
                        continue
                    _, start, end = c.take_delta()
                    parser = self.parsers[index]
                    deltas = parser.deltas(c.text, final=c.finish_reason is not None)
                    if not deltas and start != end:   # logprobs of text a parser holds back
                        deltas = [DeltaMessage(content="")]
                    for k, delta in enumerate(deltas):
                        events.append(self._chunk(ChatStreamChoice(
                            index=index, delta=delta, logprobs=self._logprobs(c, start, end) if k == 0 else None)))
                    if c.finish_reason is not None:
                        c.done = True
                        events.append(self._chunk(ChatStreamChoice(
                            index=index, delta=DeltaMessage(), finish_reason=parser.finish_reason(c.finish_reason),
                            stop_reason=c.stop_reason)))
                if events:
                    yield "".join(events)
            if self.req.include_usage:
                yield self._chunk(None, usage=self._usage())
        except APIError as err:
            yield sse_error(err)
        except EngineDeadError as exc:   # the engine core died mid-stream: a 503 error event, then [DONE]
            yield sse_error(engine_error(exc))
        except Exception as exc:   # a bug mid-stream: the client still gets an error event and [DONE]
            logger.error("request %s failed mid-stream: %r", self.id, exc)
            logger.debug("request %s traceback", self.id, exc_info=True)
            yield sse_error(APIError(f"Internal server error (request id {self.id}).", status=500))
        yield SSE_DONE
