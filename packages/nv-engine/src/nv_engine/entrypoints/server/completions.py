"""POST /v1/completions."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.entrypoints.server.engine_loop import OutputStream
from nv_engine.entrypoints.server.errors import APIError, sse_error
from nv_engine.entrypoints.server.protocol import (
    SSE_DONE,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
    random_id,
    sse,
)
from nv_engine.entrypoints.server.request_fields import COMPLETIONS, REQUEST_FIELDS
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

DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions


def split_prompts(prompt: Any) -> list[str | list[int]]:
    """The request's prompts: texts or token-id lists."""
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError("The prompt is empty.", param="prompt")
    return prompts


async def prompt_token_ids(state: ServerState, prompts: list[str | list[int]],
                           add_special_tokens: bool = True) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids) for each prompt (the texts tokenized in the batch tokenizer's thread)."""
    for p in prompts:   # every text is checked before any is tokenized
        if isinstance(p, str):
            state.limits.check_prompt_text(p)
    ids = await asyncio.gather(*(state.encode(p, add_special_tokens=add_special_tokens)
                                 for p in prompts if isinstance(p, str)))
    texts = iter(ids)
    return [(p, next(texts)) if isinstance(p, str) else (None, list(p)) for p in prompts]


async def create_completion(state: ServerState, req: CompletionRequest, raw: Request) -> Any:
    model = state.check_model(req.model)
    REQUEST_FIELDS.check(COMPLETIONS, req)
    if req.echo and req.logprobs is not None:
        raise APIError("echo with logprobs is not supported.", param="echo")
    raw_prompts = split_prompts(req.prompt)
    state.check_request(req, len(raw_prompts))
    prompts = await prompt_token_ids(state, raw_prompts, req.add_special_tokens)
    request_id = random_id("cmpl")
    engine_requests = []
    for i, (_, ids) in enumerate(prompts):
        state.check_prompt(ids)
        requested = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        max_tokens = state.resolve_max_tokens(requested, len(ids))
        params = state.build_sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs)
        params.output_kind = RequestOutputKind.DELTA   # per output only what is new (ChoiceState adds up)
        engine_requests.append((f"{request_id}-{i}", {"prompt_token_ids": ids}, params))
    try:
        stream = await state.engine.add_requests(engine_requests, stream=req.stream)
    except Exception as exc:
        raise engine_error(exc) from exc
    run = _CompletionRun(state, req, model, request_id, prompts)
    if req.stream:
        return EventStreamResponse(run.events(stream), headers=engine_headers(stream))
    body = await run_unless_disconnected(run.collect(stream), raw.receive, stream.abort)
    return JSONResponse(body, headers=engine_headers(stream))


class _CompletionRun:
    """Bookkeeping of one completion call: its choices, indexed prompt * n + sample."""

    def __init__(self, state: ServerState, req: CompletionRequest, model: str, request_id: str,
                 prompts: list[tuple[str | None, list[int]]]) -> None:
        self.req, self.model, self.id = req, model, request_id
        self.prompts = prompts
        self.fmt = LogprobFormatter(state.tokenizer)
        self.tokenizer = state.tokenizer
        self.choices = {i: ChoiceState(i) for i in range(len(prompts) * req.n)}
        self.prompt_index = {f"{request_id}-{i}": i for i in range(len(prompts))}
        self.num_cached_tokens = [0] * len(prompts)   # per prompt
        self.prompt_logprobs: list[list[dict | None] | None] = [None] * len(prompts)   # per prompt
        self.prompt_logprobs_sent: set[int] = set()   # streamed choices that carried them
        self.encoder = StreamChunkEncoder(request_id, model)
        self.continuous_usage = req.continuous_usage      # read per chunk

    def _echo(self, choice: ChoiceState) -> str:
        text, ids = self.prompts[choice.index // self.req.n]
        return text if text is not None else self.tokenizer.decode(ids)

    def _apply(self, outputs: list[Any]) -> set[int]:
        changed = set()
        for out in outputs:
            prompt = self.prompt_index[out.request_id]
            base = prompt * self.req.n
            self.num_cached_tokens[prompt] = max(self.num_cached_tokens[prompt],
                                                 out.num_cached_tokens)
            if out.prompt_logprobs is not None:
                self.prompt_logprobs[prompt] = out.prompt_logprobs
            for comp in out.outputs:
                self.choices[base + comp.index].update(comp, out.delta)
                changed.add(base + comp.index)
        return changed

    def _usage(self) -> UsageInfo:
        prompt = sum(len(ids) for _, ids in self.prompts)
        completion = sum(len(c.token_ids) for c in self.choices.values())
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                         total_tokens=prompt + completion,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(self.num_cached_tokens)))

    def _choice_counts(self, c: ChoiceState) -> tuple[int, int] | None:
        """stream_options.continuous_usage_stats: (the choice's prompt tokens, its tokens so far), as vLLM."""
        if not self.continuous_usage:
            return None
        return len(self.prompts[c.index // self.req.n][1]), len(c.token_ids)

    def _choice_usage(self, c: ChoiceState) -> UsageInfo | None:
        counts = self._choice_counts(c)
        if counts is None:
            return None
        return UsageInfo(prompt_tokens=counts[0], completion_tokens=counts[1], total_tokens=sum(counts))

    def _logprobs(self, c: ChoiceState, start: int, end: int, offset: int) -> Any:
        if self.req.logprobs is None:
            return None
        return self.fmt.completion(c.token_ids[start:end], (c.logprobs or [])[start:end],
                                   self.req.logprobs, offset)

    def _prompt_logprobs(self, c: ChoiceState) -> Any:
        return self.fmt.prompt(self.prompt_logprobs[c.index // self.req.n])

    async def collect(self, stream: OutputStream) -> dict:
        async for outputs in stream:
            self._apply(outputs)
        choices = []
        for c in self.choices.values():
            text = (self._echo(c) if self.req.echo else "") + c.text
            choices.append(CompletionChoice(
                index=c.index, text=text, logprobs=self._logprobs(c, 0, len(c.token_ids), 0),
                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                prompt_logprobs=self._prompt_logprobs(c)))
        return CompletionResponse(id=self.id, model=self.model, choices=choices,
                                  usage=self._usage()).model_dump()

    async def events(self, stream: OutputStream) -> AsyncIterator[str]:
        try:
            if self.req.echo:
                for c in self.choices.values():
                    yield sse(CompletionChunk(id=self.id, model=self.model, choices=[
                        CompletionChoice(index=c.index, text=self._echo(c))], usage=self._choice_usage(c)))
            # Every output queued since the last wait is applied at once: a choice gets one chunk
            # with all its new text and tokens, and the chunks of one wait go out in one write.
            async for outputs in stream:
                events = []
                for index in sorted(self._apply(outputs)):
                    c = self.choices[index]
                    if c.done:
                        continue
                    offset = c.sent_chars
                    delta, start, end = c.take_delta()
                    finished = c.finish_reason is not None
                    if not delta and start == end and not finished:
                        continue
                    c.done = finished
                    prompt_logprobs = None
                    if index not in self.prompt_logprobs_sent:    # the first chunk carries them
                        prompt_logprobs = self._prompt_logprobs(c)
                        self.prompt_logprobs_sent.add(index)
                    if self.req.logprobs is None and prompt_logprobs is None:    # the plain chunk, without pydantic
                        events.append(self.encoder.completion(index, delta, c.finish_reason, c.stop_reason,
                                                              self._choice_counts(c)))
                        continue
                    events.append(sse(CompletionChunk(id=self.id, model=self.model, choices=[CompletionChoice(
                        index=index, text=delta, logprobs=self._logprobs(c, start, end, offset),
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                        prompt_logprobs=prompt_logprobs)], usage=self._choice_usage(c))))
                if events:
                    yield "".join(events)
            if self.req.include_usage:
                yield sse(CompletionChunk(id=self.id, model=self.model, choices=[],
                                          usage=self._usage()))
        except APIError as err:
            yield sse_error(err)
        except EngineDeadError as exc:   # the engine core died mid-stream: a 503 error event, then [DONE]
            yield sse_error(engine_error(exc))
        except Exception as exc:   # a bug mid-stream: the client still gets an error event and [DONE]
            logger.error("request %s failed mid-stream: %r", self.id, exc)
            logger.debug("request %s traceback", self.id, exc_info=True)
            yield sse_error(APIError(f"Internal server error (request id {self.id}).", status=500))
        yield SSE_DONE
