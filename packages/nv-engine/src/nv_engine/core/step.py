"""The step contract between the host (engine) and every rank (runner): numpy arrays and Python
numbers only, so a step pickles to a worker process unchanged.

`StepInput` is what the engine sends for one step (`StepBuilder` builds it), with the sampler's
per-row inputs in a `SamplingBatch` (`SamplingBatchBuilder` builds it); `StepResult` is what rank 0
sends back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

# A sampled token the host does not know yet (async scheduling): the runner substitutes the
# previous step's sampled id on the device. Never a real token id, never a stop id.
PLACEHOLDER_TOKEN = -1

# SamplingBatch.arrays entries that ask for more than a temperature (present only when some row uses them)
_BEYOND_TEMPERATURE = ("presence_penalties", "frequency_penalties", "repetition_penalties", "allowed_token_ids",
                       "logit_bias_ids")


class SamplingFlags(TypedDict):
    """SamplingTensors' Python-side fields (a plain dict: it unpacks into SamplingTensors' keywords)."""

    num_logprobs: int
    need_logprobs: bool
    all_greedy: bool
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    max_top_k: int | None


@dataclass
class SamplingBatch:
    """Host-side sampling inputs of one step (numpy; picklable)."""

    static_id: int  # same id -> same static arrays as a previous batch
    arrays: dict[str, np.ndarray]
    flags: SamplingFlags  # SamplingTensors' Python-side fields (all_greedy, num_logprobs, ...)
    seeds_positions: np.ndarray  # [2, S] int64
    logprob_counts: list[int | None]
    prompt_token_ids: np.ndarray | None = None  # [S, Lp] int64 padded with V
    output_token_ids: np.ndarray | None = None  # [S, Lo] int64 padded with V
    banned_token_ids: np.ndarray | None = None  # [S, Lb] int64 padded with V
    # [S, ceil(V/32)] int32: bit j of word w allows token 32w + j (structured outputs; rows without a
    # grammar all ones); None when no row of the step has a grammar
    token_bitmask: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.seeds_positions.shape[1])

    @property
    def temperature_only(self) -> bool:
        """Whether every row samples with nothing but its temperature (0: greedy): no grammar bitmask, bans,
        allowed ids, logit bias, penalties, top-k / top-p / min-p filter or logprobs. The host-side twin of
        nv_layers.sampler.fast_path_applies (without a bitmask); such steps may draw inside a CUDA graph."""
        flags = self.flags
        if flags["need_logprobs"] or flags["num_logprobs"] > 0:
            return False
        if self.token_bitmask is not None or self.banned_token_ids is not None:
            return False
        if any(name in self.arrays for name in _BEYOND_TEMPERATURE):
            return False
        return flags["all_greedy"] or not (flags["any_top_k"] or flags["any_top_p"] or flags["any_min_p"])


@dataclass
class PromptLogprobsBatch:
    """The prompt rows of one step whose logprobs are wanted: hidden row rows[p] predicts prompt
    token target_ids[p]. Sequence i of seq_ids owns the next counts[i] rows, whose first target is
    prompt position first_positions[i] (positions count from 0; position 0 has no logprob)."""

    rows: np.ndarray            # [P] int64 rows of the hidden states
    target_ids: np.ndarray      # [P] int64 the prompt token each row predicts
    num_logprobs: int           # top-k width: the largest prompt_logprobs in the step
    seq_ids: list[int]
    counts: list[int]
    first_positions: list[int]


@dataclass
class PromptLogprobsResult:
    """Raw log_softmax results for a PromptLogprobsBatch's rows (float32 on the device)."""

    logprobs: list[float]                # [P] logprob of the target token
    ranks: list[int]                     # [P] its rank (1 = most likely)
    topk_ids: list[list[int]]            # [P][K]
    topk_logprobs: list[list[float]]     # [P][K]


@dataclass
class DraftInputs:
    """draft_model speculative decoding: the draft model's forwards of one step, run before the target's (built by
    spec_decode.draft_model_planner, run by runner.draft_model_runner). Sequence indices count the step's S
    sampling sequences; the drafts form an [S, K] tensor on the device (K = StepInput.draft_ids' width)."""

    # prefill-layout forwards over the tokens whose draft KV is missing, up to each sequence's last non-draft token;
    # the logits rows of catchup[n] predict draft 1 of the sampling sequences catchup_seqs[n] ([D_n] each)
    catchup: list[StepInput]
    catchup_seqs: list[np.ndarray]
    # decode-layout forward j - 1 (j = 1 .. K-1) feeds draft j of the sequences proposal_seqs[j - 1] (those with
    # more than j drafts), at position num_computed + j; its logits give their draft j + 1
    proposals: list[StepInput]
    proposal_seqs: list[np.ndarray]
    target_rows: np.ndarray      # [N] int64 rows of the target's input ids that hold a draft ...
    draft_index: np.ndarray      # [N] int64 ... whose index in the flattened [S * K] drafts is this


@dataclass
class StepInput:
    """One step's model inputs (picklable: workers of other ranks receive it)."""

    input_ids: np.ndarray        # [T] int64
    positions: np.ndarray        # [T] int64
    slot_mapping: np.ndarray     # [T] int64; slot = block * BS + offset
    seq_lens: np.ndarray         # [B] int32, context incl. this step's tokens
    cu_seqlens_q: np.ndarray     # [B+1] int32
    block_tables: np.ndarray     # [B, M] int32 (M = blocks of the longest sequence in the step)
    logits_indices: np.ndarray   # [S] int64 rows of the hidden states that sample
    is_decode: bool              # every sequence computes one token and samples
    max_seqlen_q: int
    max_seqlen_k: int
    sampling: SamplingBatch | None = None   # the S sampling rows' sampler inputs (None: greedy)
    prev_rows: np.ndarray | None = None   # [K] int64 rows of input_ids that are placeholders ...
    prev_src: np.ndarray | None = None    # [K] int64 ... for the previous step's sampled id at this index
    prompt_logprobs: PromptLogprobsBatch | None = None   # never set on a decode step
    defer_sampling: bool = False   # stop at the logits: the runner's sample() takes the token bitmask
    # speculative decoding (None: no drafts this step): sequence i of the S sampling ones verifies
    # num_drafts[i] drafts draft_ids[i, :num_drafts[i]]; logits_indices then holds S * (K+1) rows, K+1 per
    # sequence (its draft slots, then the bonus slot, the last row repeated as padding)
    draft_ids: np.ndarray | None = None    # [S, K] int64, 0 past num_drafts
    num_drafts: np.ndarray | None = None   # [S] int64 in [0, K]
    draft: DraftInputs | None = None       # draft_model: draft_ids are placeholders the draft model fills in

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


@dataclass
class StepResult:
    """What rank 0 hands back: one entry per sampling row, in SchedulerOutput.sampling order."""

    token_ids: list[int]                          # [S]
    logprobs: list[float] | None = None           # [S] logprob of the chosen token
    ranks: list[int] | None = None                # [S] rank of the chosen token (1 = most likely)
    topk_ids: list[list[int]] | None = None       # [S][K]
    topk_logprobs: list[list[float]] | None = None
    prompt_logprobs: PromptLogprobsResult | None = None   # for StepInput.prompt_logprobs
