"""SpeculativeDecoding: the engine core's side of speculative decoding (a SpeculativeConfig in use).

The scheduler asks `propose` for each decode's drafts (only in steps with at most max_batch_size running
sequences); the step verifies them in one forward (several query tokens on top of the cached KV, the chunked-
prefill path: such a step is not a pure decode, so it runs eagerly or in a mixed-batch CUDA graph, never in a
decode graph); the runner's DraftVerifier emits each sequence's run, K+1 ids per sequence padded with -1, which
`runs` splits for Scheduler.postprocess_runs. Steps run synchronously (the drafts of step N+1 are proposed from
step N's tokens). A request whose sampling needs more than temperature / top-k / top-p / min-p (logprobs,
penalties, bans, logit bias, allowed ids, min_tokens, a grammar) turns drafting off for every step while it runs.
"""
from __future__ import annotations

from nv_engine.config.speculative_config import SpeculativeConfig
from nv_engine.sampling_params import SamplingParams
from nv_engine.spec_decode.ngram_proposer import NgramProposer


class SpeculativeDecoding:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                      config.prompt_lookup_max)

    @staticmethod
    def verifiable(params: SamplingParams) -> bool:
        """Whether the RejectionSampler can verify drafts of a request with these parameters."""
        return (params.logprobs is None and params.prompt_logprobs is None and not params.needs_output_token_ids
                and params.min_tokens == 0 and params.logit_bias is None and params.allowed_token_ids is None
                and params.structured_outputs is None)

    def max_batch_size(self, num_unverifiable_requests: int) -> int:
        """The scheduler's spec_max_batch_size for the next step (0: no drafts)."""
        return 0 if num_unverifiable_requests else self.config.max_batch_size

    @staticmethod
    def runs(token_ids: list[int], num_sequences: int) -> list[list[int]]:
        """A verified step's StepResult ids ([S * (K+1)], -1 padded) -> each sequence's emitted run; a step
        without drafts has one id per sequence."""
        if num_sequences == 0:
            return []
        width = len(token_ids) // num_sequences
        return [[t for t in token_ids[i * width:(i + 1) * width] if t >= 0] for i in range(num_sequences)]
