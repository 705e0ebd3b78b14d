"""SequenceUpdate: what the engine core tells the output processor about one sequence after a step.

Plain values only (picklable), so the processor can live in another process: the core keeps the
Sequence objects, the scheduler and the finish reason; the processor only hears about them here.
"""
from __future__ import annotations

from typing import NamedTuple

from nv_engine.engine.outputs import Logprob
from nv_kvcache import FinishReason


class SequenceUpdate(NamedTuple):
    """Completion `completion_index` of request `request_id` after a step.

    new_token_ids are the output tokens not reported before (one per step for a sequence the
    processor follows token by token; every output token at once for one it only hears of when it
    finishes). finish_reason is the core's (None: still running)."""

    request_id: str
    completion_index: int                      # 0 .. n-1 (`index` would hide tuple.index)
    new_token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None      # one dict per new token, when the request asked
    cumulative_logprob_delta: float            # sum of the chosen tokens' logprobs (0.0 without)
    finish_reason: FinishReason | None
    stop_token_id: int | None                  # the EOS / stop id that finished it, if one did
    num_cached_tokens: int                     # prompt tokens found in the prefix cache
    # the prompt's logprobs (entry j for prompt position j + 1), in the first update of a request
    # that asked for them
    prompt_logprobs: list[dict[int, Logprob]] | None = None
