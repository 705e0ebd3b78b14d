"""EngineCoreRequest: one request as the engine core takes it (tokenized, parameters prepared)."""
from __future__ import annotations

from dataclasses import dataclass

from nv_engine.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    """Plain values only (picklable), so the core can live in another process.

    params went through `SamplingParams.prepare_for_model` in the frontend (checked against the
    vocabulary, bad_words tokenized), and the frontend checked the prompt length and logprob
    widths. reports_every_token is `params.needs_every_token(...)` as the frontend decided it.
    arrival_time is time.monotonic() in the frontend (one clock for every process of a host)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    reports_every_token: bool
    arrival_time: float
