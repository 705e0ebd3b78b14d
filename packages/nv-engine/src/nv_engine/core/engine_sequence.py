"""EngineSequence: an nv_kvcache Sequence with what the engine core needs to sample and report it."""
from __future__ import annotations

from collections.abc import Iterable

from nv_engine.engine.outputs import SampleLogprobs
from nv_engine.sampling_params import SamplingParams
from nv_engine.spec_decode.draft_acceptance import DraftAcceptance
from nv_kvcache import Sequence, StopRules


class EngineSequence(Sequence):
    """Completion `index` of request `request_id`.

    reports_each_token: the output processor hears of it after every step it samples in (it
    streams, detokenizes for stop strings, records logprobs, or its siblings wait for its prompt);
    otherwise only once, when it finishes, with every output token (the batch-256 fast path).
    num_reported: output tokens already sent; reported_finished: its final update was sent (or it
    was aborted), so a step still in flight drops its token.
    prompt_logprobs: for the sequence that computes a request's prompt logprobs (completion 0), the
    entries so far, entry j for prompt position j + 1; None for every other sequence."""

    __slots__ = ("draft_acceptance", "draft_computed_tokens", "index", "num_reported", "params", "prompt_logprobs",
                 "reported_finished", "reports_each_token", "request_id", "seed")

    def __init__(self, prompt_token_ids: Iterable[int], rules: StopRules, *, request_id: str,
                 index: int, params: SamplingParams, seed: int, reports_each_token: bool) -> None:
        super().__init__(prompt_token_ids, rules)
        self.request_id = request_id
        self.index = index
        self.params = params
        self.seed = seed
        self.reports_each_token = reports_each_token
        self.num_reported = 0
        self.reported_finished = False
        self.prompt_logprobs: list[SampleLogprobs] | None = None
        # draft_model speculative decoding: positions [0, this) hold the draft model's valid KV (-1: not yet
        # scheduled; spec_decode.draft_model_planner keeps it)
        self.draft_computed_tokens = -1
        # speculative decoding with an adaptive draft length: its recent acceptance (spec_decode.draft_length_policy)
        self.draft_acceptance = DraftAcceptance()
        if index == 0 and params.prompt_logprobs is not None:
            self.prompt_logprobs = []
            self.skip_prefix_cache = True    # every prompt position must be computed
