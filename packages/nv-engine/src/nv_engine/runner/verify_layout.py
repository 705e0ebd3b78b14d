"""VerifyLayout: a step that verifies drafts, from its compact token layout to the fixed one the verify CUDA graphs
replay on (numpy, on the host).

In the compact layout (StepBuilder) sequence b has 1 + d_b query tokens (its last token, then its drafts) back to
back. The fixed layout gives every sequence the same Q = 1 + num_speculative_tokens rows, its tokens at the end and
padding rows in front (id 0, the sequence's first query position, slot -1: computed, never stored, never read).
The attention then reads the last Q positions of each context (nv_kernels' decode_queries): with the real tokens
last, row j of a sequence of length L attends to positions < L - Q + 1 + j, which for the real rows is exactly the
causal mask of the compact layout, so both layouts give the same numbers per real token.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from nv_engine.core.step import StepInput


class VerifyRows(NamedTuple):
    """One verify step in the fixed layout of B sequences x Q rows (not yet padded to the graph's batch size)."""

    input_ids: np.ndarray       # [B * Q] int64
    positions: np.ndarray       # [B * Q] int64
    slot_mapping: np.ndarray    # [B * Q] int64, -1 on padding rows
    row_of_token: np.ndarray    # [T] int64: the fixed-layout row of each compact-layout token
    logits_rows: np.ndarray     # [S * (K+1)] int64: step.logits_indices mapped to fixed-layout rows


class VerifyLayout:
    """query_len: Q, the rows per sequence (1 + num_speculative_tokens)."""

    def __init__(self, query_len: int) -> None:
        if query_len < 2:
            raise ValueError(f"a verify layout needs at least 2 query rows per sequence, got {query_len}")
        self.query_len = query_len

    def fits(self, step: StepInput) -> bool:
        """Whether the step is a verify step this layout holds: drafts, every sequence sampling, each with one
        token plus its drafts (a one-token prompt chunk counts as such a token), at most Q tokens, no prompt
        logprobs."""
        if step.num_drafts is None or not self.holds(step) or len(step.num_drafts) != step.num_seqs:
            return False
        return bool(np.array_equal(np.diff(step.cu_seqlens_q), step.num_drafts + 1))

    def holds(self, step: StepInput) -> bool:
        """Whether the layout holds the step's tokens: a compact-layout step (not decode) of at least one sequence,
        each with 1 to Q query tokens, no prompt logprobs. A draft model's catch-up forward of a decode-only step
        (runner.catchup_graphs) is such a step, without drafts."""
        if step.is_decode or step.prompt_logprobs is not None or step.num_seqs == 0:
            return False
        q_lens = np.diff(step.cu_seqlens_q)                                            # [B]
        return int(q_lens.min()) >= 1 and int(q_lens.max()) <= self.query_len

    def rows(self, step: StepInput) -> VerifyRows:
        """The fixed layout of a step that `fits`."""
        q = self.query_len
        cu = step.cu_seqlens_q.astype(np.int64)                                        # [B+1]
        q_lens = np.diff(cu)                                                           # [B]
        num_seqs = len(q_lens)
        # token t of sequence b (compact row cu[b] + i) -> fixed row b * Q + (Q - q_len[b]) + i
        shift = np.arange(num_seqs, dtype=np.int64) * q + (q - q_lens) - cu[:-1]       # [B]
        row_of_token = np.arange(step.num_tokens, dtype=np.int64) + np.repeat(shift, q_lens)   # [T]
        input_ids = np.zeros(num_seqs * q, dtype=np.int64)
        input_ids[row_of_token] = step.input_ids
        positions = np.repeat(step.positions[cu[:-1]], q)                              # padding: first position
        positions[row_of_token] = step.positions
        slot_mapping = np.full(num_seqs * q, -1, dtype=np.int64)
        slot_mapping[row_of_token] = step.slot_mapping
        return VerifyRows(input_ids, positions, slot_mapping, row_of_token, row_of_token[step.logits_indices])
