"""From a SchedulerOutput to the runner's StepInput: plain numpy arrays, built without a Python
list per token in decode steps.

The engine keeps one `StepBuilder`. Block tables are cached per sequence in a persistent numpy
array (one row per live sequence, appended incrementally: a decode step adds at most one block),
so a step gathers its [B, M] table with one `np.take` instead of converting Python lists.
Idea from vLLM v1's persistent input batch / block table.
"""
from __future__ import annotations

import numpy as np

from nv_engine.block_table_cache import BlockTableCache
from nv_engine.step import PLACEHOLDER_TOKEN, PromptLogprobsBatch, SamplingBatch, StepInput
from nv_kvcache import SchedulerOutput


class StepBuilder:
    """Builds StepInputs; owns the block-table cache. One per engine (rank 0)."""

    def __init__(self, block_size: int, max_blocks_per_seq: int) -> None:
        self.block_size = block_size
        self.blocks = BlockTableCache(max_blocks_per_seq)

    def release(self, seq_id: int) -> None:
        self.blocks.release(seq_id)

    def build(self, out: SchedulerOutput, sampling: SamplingBatch | None = None,
              prev_index: dict[int, int] | None = None,
              prompt_logprobs: dict[int, int] | None = None) -> StepInput:
        """prev_index: seq_id -> row in the previous step's sampled ids, for sequences whose last
        token is still PLACEHOLDER_TOKEN (scheduled before the previous step's ids came back).
        prompt_logprobs: seq_id -> top-k width, for sequences that want their prompt's logprobs."""
        for seq in out.preempted:
            self.blocks.release(seq.seq_id)
        scheduled = out.scheduled
        bs = self.block_size
        row_of = self.blocks.row
        rows_list, starts_list = [], []
        for s in scheduled:
            rows_list.append(row_of(s.seq))
            starts_list.append(s.seq.num_computed_tokens)
        rows = np.array(rows_list, dtype=np.int64)                                    # [B]
        starts = np.array(starts_list, dtype=np.int64)                                # [B]
        if out.is_pure_decode:
            input_ids = np.array([s.seq.token_ids[-1] for s in scheduled], dtype=np.int64)
            positions = starts
            q_lens = np.ones(len(scheduled), dtype=np.int64)
            token_rows = rows
            logits_indices = np.arange(len(scheduled), dtype=np.int64)
        else:
            q_lens = np.fromiter((s.num_new_tokens for s in scheduled), dtype=np.int64,
                                 count=len(scheduled))
            ids: list[int] = []
            for s in scheduled:
                start = s.seq.num_computed_tokens
                ids.extend(s.seq.token_ids[start:start + s.num_new_tokens])
            input_ids = np.array(ids, dtype=np.int64)                                 # [T]
            total = int(q_lens.sum())
            seq_starts_in_batch = np.cumsum(q_lens) - q_lens                          # [B]
            positions = (np.arange(total, dtype=np.int64)
                         - np.repeat(seq_starts_in_batch - starts, q_lens))           # [T]
            token_rows = np.repeat(rows, q_lens)                                      # [T]
            samples = np.fromiter((s.samples for s in scheduled), dtype=bool, count=len(scheduled))
            logits_indices = (seq_starts_in_batch + q_lens - 1)[samples]              # [S]
        seq_lens = (starts + q_lens).astype(np.int32)                                 # [B]
        cu_seqlens_q = np.zeros(len(scheduled) + 1, dtype=np.int32)
        cu_seqlens_q[1:] = np.cumsum(q_lens)
        slot_mapping = self.blocks.table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        max_seqlen_k = int(seq_lens.max()) if len(scheduled) else 0
        num_block_cols = max(1, -(-max_seqlen_k // bs))
        block_tables = self.blocks.table[rows, :num_block_cols]                       # [B, M]
        prompt_batch = None
        if prompt_logprobs and not out.is_pure_decode:   # a decode step computes no prompt position
            prompt_batch = self._prompt_logprobs_batch(out, prompt_logprobs, cu_seqlens_q)
        prev_rows = prev_src = None
        if prev_index:
            rows_l, src_l = [], []
            for i, s in enumerate(scheduled):
                j = prev_index.get(s.seq.seq_id)
                seq = s.seq
                if (j is not None and seq.token_ids[-1] == PLACEHOLDER_TOKEN
                        and seq.num_computed_tokens + s.num_new_tokens == len(seq.token_ids)):
                    rows_l.append(i)
                    src_l.append(j)
            if rows_l:
                prev_rows = cu_seqlens_q[1:][rows_l].astype(np.int64) - 1                 # [K]
                prev_src = np.array(src_l, dtype=np.int64)                                 # [K]
        return StepInput(
            input_ids=input_ids, positions=positions, slot_mapping=slot_mapping, seq_lens=seq_lens,
            cu_seqlens_q=cu_seqlens_q, block_tables=block_tables, logits_indices=logits_indices,
            is_decode=out.is_pure_decode, max_seqlen_q=int(q_lens.max()) if len(scheduled) else 0,
            max_seqlen_k=max_seqlen_k, sampling=sampling, prev_rows=prev_rows, prev_src=prev_src,
            prompt_logprobs=prompt_batch)

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
