"""RequestState: what the output processor knows of one request (prompt, parameters, n completions)."""
from __future__ import annotations

from dataclasses import dataclass

from nv_engine.completion_state import CompletionState
from nv_engine.engine_requests import Tokenizer
from nv_engine.outputs import RequestOutput, SampleLogprobs
from nv_engine.sampling_params import SamplingParams


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

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)

    def to_output(self, tokenizer: Tokenizer | None) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=[c.to_output(tokenizer) for c in self.completions], finished=self.finished,
            num_cached_tokens=self.num_cached_tokens, prompt_logprobs=self.prompt_logprobs)
