"""RequestState: what the output processor knows of one request (prompt, parameters, n completions)."""
from __future__ import annotations

from dataclasses import dataclass

from nv_engine.engine.completion_state import CompletionState
from nv_engine.engine.engine_requests import Tokenizer
from nv_engine.engine.outputs import RequestOutput, SampleLogprobs
from nv_engine.sampling_params import RequestOutputKind, SamplingParams


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    completions: list[CompletionState]     # all n, in index order
    num_cached_tokens: int = 0             # completion 0's prompt tokens found in the prefix cache
    # vLLM's shape: None for the first prompt token, then one dict per prompt position
    prompt_logprobs: list[SampleLogprobs | None] | None = None
    _prompt_logprobs_sent: bool = False    # delta outputs carry them once
    # stream_interval: tokens of all completions since the last output; whether one was sent; whether a
    # completion finished since (its end goes out at once)
    unsent_tokens: int = 0
    output_sent: bool = False
    completion_finished: bool = False

    @property
    def finished(self) -> bool:
        for completion in self.completions:
            if completion.finish_reason is None:
                return False
        return True

    def output_due(self, stream_interval: int) -> bool:
        """Whether a streamed output should go out now: its first, one per stream_interval tokens of each
        completion, or a completion's end. Outputs left out lose nothing: the next one carries their news."""
        return (stream_interval == 1 or not self.output_sent or self.completion_finished
                or self.unsent_tokens >= stream_interval * len(self.completions))

    def to_output(self, tokenizer: Tokenizer | None) -> RequestOutput:
        """Every completion, cumulative or (output_kind DELTA) what is new since the last output."""
        self.unsent_tokens = 0
        self.output_sent = True
        self.completion_finished = False
        delta = self.params.output_kind is RequestOutputKind.DELTA
        prompt_logprobs = self.prompt_logprobs
        if delta and prompt_logprobs is not None:
            prompt_logprobs = None if self._prompt_logprobs_sent else prompt_logprobs
            self._prompt_logprobs_sent = True
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=[c.to_output(tokenizer, delta=delta) for c in self.completions], finished=self.finished,
            num_cached_tokens=self.num_cached_tokens, prompt_logprobs=prompt_logprobs, delta=delta)
