"""The completion and chat stream handlers coalesce: the outputs queued for a stream since its last
wait become one chunk per choice (all the new text and tokens), written at once, and the usage
figures (continuous_usage_stats and the final usage chunk) still count every token."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from nv_engine.entrypoints.server.chat import _ChatRun  # noqa: E402
from nv_engine.entrypoints.server.chat_output_parser import ChatOutputParser  # noqa: E402
from nv_engine.entrypoints.server.completions import _CompletionRun  # noqa: E402
from nv_engine.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from nv_engine.outputs import CompletionOutput, RequestOutput  # noqa: E402

PROMPT = [1, 2, 3]
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def _output(request_id: str, text: str, finish: str | None = None) -> RequestOutput:
    ids = list(range(10, 10 + len(text)))                  # one token per character
    return RequestOutput(request_id, None, PROMPT, [CompletionOutput(0, text, ids, None, None, finish)],
                         finished=finish is not None)


class _QueuedOutputs:
    """An OutputStream stand-in: each wait returns every output queued since the last one."""

    def __init__(self, waits: list[list[RequestOutput]]) -> None:
        self.waits = waits

    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        for outputs in self.waits:
            yield outputs


def _events(writes: list[str]) -> list[dict]:
    events = [event for write in writes for event in write.split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    return [json.loads(event.removeprefix("data: ")) for event in events[:-1]]


async def _collect(chunks: AsyncIterator[str]) -> list[str]:
    return [chunk async for chunk in chunks]


def test_completion_stream_one_chunk_per_wait_with_every_queued_token():
    req = CompletionRequest(model="m", prompt=PROMPT, stream=True, stream_options=STREAM_OPTIONS)
    run = _CompletionRun(SimpleNamespace(tokenizer=None), req, "m", "cmpl-x", [(None, PROMPT)])
    waits = [[_output("cmpl-x-0", "a"), _output("cmpl-x-0", "ab"), _output("cmpl-x-0", "abc")],
             [_output("cmpl-x-0", "abcd"), _output("cmpl-x-0", "abcde", "length")]]
    writes = asyncio.run(_collect(run.events(_QueuedOutputs(waits))))
    assert len(writes) == 4                                 # a write per wait, the usage chunk, [DONE]
    first, last, usage = _events(writes)
    assert first["choices"][0]["text"] == "abc" and first["usage"]["completion_tokens"] == 3
    assert last["choices"][0]["text"] == "de" and last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": None}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5


def test_chat_stream_one_delta_per_wait_and_the_finish_in_the_same_write():
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                stream_options=STREAM_OPTIONS)
    run = _ChatRun(SimpleNamespace(tokenizer=None), req, "m", "chatcmpl-x", len(PROMPT), None,
                   {0: ChatOutputParser()})
    waits = [[_output("chatcmpl-x", "he"), _output("chatcmpl-x", "hell")],
             [_output("chatcmpl-x", "hello", "stop")]]
    writes = asyncio.run(_collect(run.events(_QueuedOutputs(waits))))
    assert len(writes) == 5                                 # the role, a write per wait, usage, [DONE]
    role, first, last, finish, usage = _events(writes)
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert first["choices"][0]["delta"]["content"] == "hell" and first["usage"]["completion_tokens"] == 4
    assert last["choices"][0]["delta"]["content"] == "o" and finish["choices"][0]["finish_reason"] == "stop"
    assert usage["usage"]["completion_tokens"] == 5
