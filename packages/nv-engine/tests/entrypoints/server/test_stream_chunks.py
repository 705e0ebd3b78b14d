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

from nv_engine.engine.outputs import CompletionOutput, RequestOutput  # noqa: E402
from nv_engine.entrypoints.server.chat import _ChatRun  # noqa: E402
from nv_engine.entrypoints.server.chat_output_parser import ChatOutputParser  # noqa: E402
from nv_engine.entrypoints.server.completions import _CompletionRun  # noqa: E402
from nv_engine.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402

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



HOSTILE_TEXTS = ["", " hello", 'quote " backslash \\ slash /', "tab\tnew\nline\rcr", "\x00\x01\x1f\x7f",
                 "é ü 中文 🙂", "\u2028\u2029", "</script>", "a" * 5000]
ENDINGS = [(None, None, (100, 5)), ("stop", "</s>", None), ("stop", 2, (7, 0)), ("length", None, (3, 1024))]


@pytest.fixture
def fixed_clock(monkeypatch):
    from nv_engine.entrypoints.server import protocol, stream_chunk_encoder

    monkeypatch.setattr(stream_chunk_encoder.time, "time", lambda: 1_800_000_000.7)
    monkeypatch.setattr(protocol.time, "time", lambda: 1_800_000_000.7)


def _usage_model(usage):
    from nv_engine.entrypoints.server.protocol import UsageInfo

    return None if usage is None else UsageInfo(prompt_tokens=usage[0], completion_tokens=usage[1],
                                                total_tokens=sum(usage))


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
@pytest.mark.parametrize(("finish_reason", "stop_reason", "usage"), ENDINGS)
def test_plain_completion_chunk_is_the_models_json(text, finish_reason, stop_reason, usage, fixed_clock):
    """The encoder's completion chunk is, byte for byte, what the pydantic models give for the same chunk."""
    from nv_engine.entrypoints.server.protocol import CompletionChoice, CompletionChunk, sse
    from nv_engine.entrypoints.server.stream_chunk_encoder import StreamChunkEncoder

    fast = StreamChunkEncoder("cmpl-1", "the/model").completion(3, text, finish_reason, stop_reason, usage)
    slow = sse(CompletionChunk(id="cmpl-1", model="the/model", choices=[CompletionChoice(
        index=3, text=text, logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)],
        usage=_usage_model(usage)))
    assert fast == slow


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
@pytest.mark.parametrize(("finish_reason", "stop_reason", "usage"), ENDINGS)
@pytest.mark.parametrize("fields", ["role", "content", "reasoning", "reasoning_only", "none"])
def test_plain_chat_chunk_is_the_models_json(text, finish_reason, stop_reason, usage, fields, fixed_clock):
    """The same for chat deltas: role and content always there (null when unset), reasoning fields only when set."""
    from nv_engine.entrypoints.server.protocol import ChatCompletionChunk, ChatStreamChoice, DeltaMessage, sse
    from nv_engine.entrypoints.server.stream_chunk_encoder import StreamChunkEncoder

    values = {"role": dict(role="assistant", content=text), "content": dict(content=text),
              "reasoning": dict(content="", reasoning=text, reasoning_content=text),
              "reasoning_only": dict(reasoning=text), "none": {}}[fields]
    delta = DeltaMessage(**values)
    fast = StreamChunkEncoder("chatcmpl-1", "m").chat(2, delta.role, delta.content, delta.reasoning,
                                                      delta.reasoning_content, finish_reason, stop_reason, usage)
    slow = sse(ChatCompletionChunk(id="chatcmpl-1", model="m", choices=[ChatStreamChoice(
        index=2, delta=delta, finish_reason=finish_reason, stop_reason=stop_reason)], usage=_usage_model(usage)))
    assert fast == slow
