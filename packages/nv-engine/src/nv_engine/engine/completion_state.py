"""CompletionState: what the output processor knows of one of a request's n completions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from nv_engine.engine.detokenizer import IncrementalDetokenizer
from nv_engine.engine.engine_requests import Tokenizer
from nv_engine.engine.outputs import CompletionOutput, SampleLogprobs
from nv_kvcache import FinishReason


@dataclass(eq=False)
class CompletionState:
    """Token ids, text, logprobs and finish / stop reason of one completion, as reported so far.

    Without a detokenizer the text is decoded once, when the completion finishes. `to_output(delta=True)`
    reports what is new since its previous delta output (the streamed text never shrinks: text held
    back for a stop string is only cut, never sent)."""

    index: int
    skip_special_tokens: bool
    detokenizer: IncrementalDetokenizer | None
    logprobs: list[SampleLogprobs] | None = None     # per token: {token id: Logprob}
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None              # the stop string or stop token id that ended it
    _final_text: str | None = None
    _sent_tokens: int = 0                             # delta outputs: token ids (and logprobs) sent
    _sent_chars: int = 0                              # delta outputs: characters of text sent

    def text(self, tokenizer: Tokenizer | None, start: int = 0) -> str:
        """The text so far from character `start` on."""
        finished = self.finish_reason is not None
        if self.detokenizer is not None:
            return self.detokenizer.stream_text(finished, start)
        if tokenizer is None or not finished:
            return ""
        if self._final_text is None:
            # A multi-byte character cut at the end decodes to U+FFFD: dropped, as the incremental
            # detokenizer never emits it either.
            text = cast(str, tokenizer.decode(   # one list of ids: one str
                self.token_ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False))
            self._final_text = text.rstrip("\ufffd")
        return self._final_text[start:]

    def to_output(self, tokenizer: Tokenizer | None, *, delta: bool = False) -> CompletionOutput:
        if delta:   # O(new tokens): slices of what is new
            start, end = self._sent_tokens, len(self.token_ids)
            text = self.text(tokenizer, self._sent_chars)
            self._sent_tokens = end
            self._sent_chars += len(text)
            token_ids = self.token_ids[start:end]
            logprobs = self.logprobs[start:end] if self.logprobs is not None else None
        else:       # copies: the caller may keep them while this completion grows
            text = self.text(tokenizer)
            token_ids = list(self.token_ids)
            logprobs = list(self.logprobs) if self.logprobs is not None else None
        return CompletionOutput(
            index=self.index, text=text, token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=self.finish_reason.value if self.finish_reason is not None else None,
            stop_reason=self.stop_reason)
