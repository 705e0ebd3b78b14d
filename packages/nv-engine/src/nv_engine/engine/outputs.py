"""What the engine returns: RequestOutput, CompletionOutput and Logprob, shaped as vLLM's."""
from __future__ import annotations

from dataclasses import dataclass, field

# One generated token's logprobs: token id -> Logprob, the top `logprobs` tokens plus the chosen one.
SampleLogprobs = dict[int, "Logprob"]


@dataclass
class Logprob:
    """Log-probability of one token; rank 1 is the most likely token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One of a request's `n` completions."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[SampleLogprobs] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state after a step: the prompt and every completion, each with everything so far
    (full text), or with `delta` (SamplingParams.output_kind DELTA) only what is new since the
    request's previous output; cumulative_logprob and finish / stop reasons are always whole."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    prompt_logprobs: list[SampleLogprobs | None] | None = field(default=None, repr=False)
    delta: bool = False
