"""From a SchedulerOutput to the runner's StepInput: plain numpy arrays, built without a Python
list per token in decode steps.

The engine keeps one `StepBuilder`. Block tables are cached per sequence in a persistent numpy
array (one row per live sequence, appended incrementally: a decode step adds at most one block),
so a step gathers its [B, M] table with one `np.take` instead of converting Python lists.
Idea from vLLM v1's persistent input batch / block table.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nv_engine.core.block_table_cache import BlockTableCache
from nv_engine.core.step import PLACEHOLDER_TOKEN, PromptLogprobsBatch, SamplingBatch, StepInput
from nv_kvcache import SchedulerOutput

if TYPE_CHECKING:
    from nv_engine.spec_decode.draft_model_planner import DraftModelPlanner


class StepBuilder:
    """Builds StepInputs; owns the block-table cache. One per engine (rank 0). draft_planner: draft_model
    speculative decoding, which adds the draft model's forwards to a step (StepInput.draft)."""

    def __init__(self, block_size: int, max_blocks_per_seq: int,
                 draft_planner: DraftModelPlanner | None = None) -> None:
        self.block_size = block_size
        self.draft_planner = draft_planner
        self.blocks = BlockTableCache(max_blocks_per_seq)
        # [S] block-table rows of the last built step's sampling entries, in sampling order: how a
        # following step finds the sampled id of each of its placeholder tokens
        self._sampled_rows = np.zeros(0, dtype=np.int64)

    def release(self, seq_id: int) -> None:
        self.blocks.release(seq_id)

    def build(self, out: SchedulerOutput, sampling: SamplingBatch | None = None, *,
              follows_previous: bool = False, prompt_logprobs: dict[int, int] | None = None) -> StepInput:
        """follows_previous: the step was scheduled before the previously built step's sampled ids
        came back; a sequence whose last token is still PLACEHOLDER_TOKEN takes its id on the device
        (StepInput.prev_rows / prev_src). A placeholder is always the last token of a sampling entry
        (the scheduler resolves a step's placeholders before it schedules the one after next), and a
        sequence keeps its block-table row from one step to the next, so rows map them.
        prompt_logprobs: seq_id -> top-k width, for sequences that want their prompt's logprobs."""
        blocks = self.blocks
        for seq in out.preempted:
            blocks.release(seq.seq_id)
        scheduled = out.scheduled
        num_seqs = len(scheduled)
        bs = self.block_size
        seqs = [s.seq for s in scheduled]
        rows = np.array(blocks.rows(seqs), dtype=np.int64)                             # [B]
        starts = np.array([seq.num_computed_tokens for seq in seqs], dtype=np.int64)   # [B]
        if out.is_pure_decode:
            input_ids = np.array([seq.token_ids[-1] for seq in seqs], dtype=np.int64)  # [B]
            positions = starts
            seq_lens = (starts + 1).astype(np.int32)                                   # [B]
            cu_seqlens_q = np.arange(num_seqs + 1, dtype=np.int32)                     # [B+1]
            token_rows = sampled_rows = rows
            logits_indices = np.arange(num_seqs, dtype=np.int64)                       # [S] = [B]
            last_ids = input_ids                                                       # [S]
            max_seqlen_q = 1
        else:
            q_lens = np.array([s.num_new_tokens for s in scheduled], dtype=np.int64)  # [B]
            ids: list[int] = []
            for s in scheduled:
                start = s.seq.num_computed_tokens
                ids.extend(s.seq.token_ids[start:start + s.num_new_tokens])
                if out.num_draft_tokens:         # speculative decoding: the drafts follow the sequence's tokens
                    ids.extend(s.seq.spec_token_ids)
            input_ids = np.array(ids, dtype=np.int64)                                 # [T]
            cu_seqlens_q = np.zeros(num_seqs + 1, dtype=np.int32)                     # [B+1]
            np.cumsum(q_lens, out=cu_seqlens_q[1:])
            seq_starts_in_batch = cu_seqlens_q[:-1].astype(np.int64)                  # [B]
            positions = (np.arange(len(ids), dtype=np.int64)
                         - np.repeat(seq_starts_in_batch - starts, q_lens))           # [T]
            token_rows = np.repeat(rows, q_lens)                                      # [T]
            samples = np.array([s.samples for s in scheduled], dtype=bool)            # [B]
            logits_indices = (seq_starts_in_batch + q_lens - 1)[samples]              # [S]
            last_ids = input_ids[logits_indices]                                      # [S]
            sampled_rows = rows[samples]                                              # [S]
            seq_lens = (starts + q_lens).astype(np.int32)                             # [B]
            max_seqlen_q = int(q_lens.max()) if num_seqs else 0
            if out.num_draft_tokens:
                draft_ids, num_drafts, logits_indices = self._verification_rows(out, logits_indices)
        table = blocks.table
        block_index, offset = np.divmod(positions, bs)                               # [T], [T]
        slot_mapping = table[token_rows, block_index].astype(np.int64) * bs + offset  # [T]
        max_seqlen_k = int(seq_lens.max()) if num_seqs else 0
        block_tables = table[rows, :max(1, -(-max_seqlen_k // bs))]                   # [B, M]
        prompt_batch = None
        if prompt_logprobs and not out.is_pure_decode:   # a decode step computes no prompt position
            prompt_batch = self._prompt_logprobs_batch(out, prompt_logprobs, cu_seqlens_q)
        prev_rows = prev_src = None
        if not out.num_draft_tokens:
            draft_ids = num_drafts = None
        previous_rows = self._sampled_rows
        if follows_previous and len(previous_rows):
            placeholders = last_ids == PLACEHOLDER_TOKEN                              # [S]
            if placeholders.all() and np.array_equal(sampled_rows, previous_rows):   # the same rows again
                prev_rows, prev_src = logits_indices, np.arange(len(previous_rows), dtype=np.int64)  # [S], [S]
            elif placeholders.any():
                sample_of_row = np.full(len(table), -1, dtype=np.int64)               # [R]
                sample_of_row[previous_rows] = np.arange(len(previous_rows))
                prev_src = sample_of_row[sampled_rows[placeholders]]                  # [K]
                prev_rows = logits_indices[placeholders]                              # [K]
                if (prev_src < 0).any():
                    raise RuntimeError("a placeholder token of a sequence the previous step did not sample")
        self._sampled_rows = sampled_rows
        step = StepInput(
            input_ids=input_ids, positions=positions, slot_mapping=slot_mapping, seq_lens=seq_lens,
            cu_seqlens_q=cu_seqlens_q, block_tables=block_tables, logits_indices=logits_indices,
            is_decode=out.is_pure_decode, max_seqlen_q=max_seqlen_q if num_seqs else 0,
            max_seqlen_k=max_seqlen_k, sampling=sampling, prev_rows=prev_rows, prev_src=prev_src,
            prompt_logprobs=prompt_batch, draft_ids=draft_ids, num_drafts=num_drafts)
        if self.draft_planner is not None and num_seqs:
            step.draft = self.draft_planner.plan(out, step)
        return step

    @staticmethod
    def _verification_rows(out: SchedulerOutput, last_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Speculative decoding: ([S, K] draft ids, [S] draft counts, [S * (K+1)] logits rows). Sampling
        sequence i with d drafts scores rows last - d .. last (last: its last row), padded with `last`."""
        drafts = [entry.seq.spec_token_ids for entry in out.sampling]
        num_drafts = np.array([len(d) for d in drafts], dtype=np.int64)             # [S]
        k = int(num_drafts.max())
        draft_ids = np.zeros((len(drafts), k), dtype=np.int64)                       # [S, K]
        for i, d in enumerate(drafts):
            draft_ids[i, :len(d)] = d
        slots = np.arange(k + 1, dtype=np.int64)[None, :]                            # [1, K+1]
        first = (last_rows - num_drafts)[:, None]                                    # [S, 1]
        rows = np.minimum(first + slots, last_rows[:, None])                         # [S, K+1]
        return draft_ids, num_drafts, rows.reshape(-1)

    @staticmethod
    def _prompt_logprobs_batch(out: SchedulerOutput, widths: dict[int, int],
                               cu_seqlens_q: np.ndarray) -> PromptLogprobsBatch | None:
        """The rows of the step's prompt chunks that predict a next prompt token: a chunk computing
        positions [start, start + n) yields logprobs for prompt positions start + 1 .. start + n
        (capped at the prompt's last position)."""
        rows: list[np.ndarray] = []
        targets: list[int] = []
        seq_ids, counts, first_positions = [], [], []
        num_logprobs = 0
        for i, s in enumerate(out.scheduled):
            seq = s.seq
            width = widths.get(seq.seq_id)
            if width is None:
                continue
            start = seq.num_computed_tokens
            count = min(start + s.num_new_tokens, len(seq.prompt_token_ids) - 1) - start
            if count <= 0:
                continue
            rows.append(np.arange(count, dtype=np.int64) + int(cu_seqlens_q[i]))
            targets.extend(seq.prompt_token_ids[start + 1:start + 1 + count])
            seq_ids.append(seq.seq_id)
            counts.append(count)
            first_positions.append(start + 1)
            num_logprobs = max(num_logprobs, width)
        if not seq_ids:
            return None
        return PromptLogprobsBatch(np.concatenate(rows), np.array(targets, dtype=np.int64), num_logprobs,
                                   seq_ids, counts, first_positions)
