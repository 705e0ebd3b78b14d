"""What one engine step did, as the frontend sees it (vLLM's `IterationStats` / `FinishedRequestStats`).
Plain dataclasses: built once per step, read by every stat logger. Times are seconds."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class FinishedRequestStats:
    """One request that finished in the step. queued: arrival -> first scheduled; prefill: first
    scheduled -> first token; decode: first token -> last token; inference = prefill + decode."""

    finish_reason: str                   # "stop" | "length" | "abort"
    e2e_latency_s: float
    queued_time_s: float
    prefill_time_s: float
    decode_time_s: float
    inference_time_s: float
    num_prompt_tokens: int
    num_generation_tokens: int


@dataclass(slots=True)
class IterationStats:
    """The tokens and latencies of one step. num_prompt_tokens counts the prompts of requests that
    got their first token in this step (vLLM's convention), num_generation_tokens every token out."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)
