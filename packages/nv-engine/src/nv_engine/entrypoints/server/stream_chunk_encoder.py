"""StreamChunkEncoder: the server-sent events of a streamed response's plain chunks, without pydantic."""
from __future__ import annotations

import time

import msgspec


class StreamChunkEncoder:
    """`data: {...}` events of one streamed /v1/completions or /v1/chat/completions response, for the chunks a
    stream is made of (text or a content / reasoning delta, no logprobs, no tool calls): the same JSON, key for
    key, as `protocol.sse(CompletionChunk(...))` / `sse(ChatCompletionChunk(...))`, built from dicts by msgspec.

    Why: a streamed token costs the server one chunk, and at 256 streams the asyncio loop formats ~25,000 of
    them per second. Building the pydantic models and dumping them takes ~17 us per chunk, this ~3 us (one CPU
    core, timeit). Other chunks (logprobs, tool calls, prompt logprobs) keep the models."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model
        self._encoder = msgspec.json.Encoder()

    @staticmethod
    def _usage(usage: tuple[int, int] | None) -> dict | None:
        if usage is None:
            return None
        prompt, completion = usage
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": None}

    def _event(self, body: dict) -> str:
        return f"data: {self._encoder.encode(body).decode()}\n\n"

    def completion(self, index: int, text: str, finish_reason: str | None, stop_reason: int | str | None,
                   usage: tuple[int, int] | None) -> str:
        """One choice's text chunk; usage is (prompt tokens, completion tokens so far) or None."""
        return self._event({
            "id": self.response_id, "object": "text_completion", "created": int(time.time()), "model": self.model,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                         "stop_reason": stop_reason, "prompt_logprobs": None}],
            "usage": self._usage(usage)})

    def chat(self, index: int, role: str | None, content: str | None, reasoning: str | None,
             reasoning_content: str | None, finish_reason: str | None, stop_reason: int | str | None,
             usage: tuple[int, int] | None) -> str:
        """One choice's delta chunk (DeltaMessage's fields without tool calls: role and content always, the
        reasoning fields only when set, as DeltaMessage leaves them out while None)."""
        delta: dict = {"role": role, "content": content}
        if reasoning is not None:
            delta["reasoning"] = reasoning
        if reasoning_content is not None:
            delta["reasoning_content"] = reasoning_content
        return self._event({
            "id": self.response_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                         "stop_reason": stop_reason}],
            "usage": self._usage(usage)})
