"""From a SchedulerOutput to the runner's StepInput: plain numpy arrays, built without a Python
list per token in decode steps.

The engine keeps one `StepBuilder`. Block tables are cached per sequence in a persistent numpy
array (one row per live sequence, appended incrementally: a decode step adds at most one block),
so a step gathers its [B, M] table with one `np.take` instead of converting Python lists.
Idea from vLLM v1's persistent input batch / block table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nv_kvcache import SchedulerOutput, Sequence

# A sampled token the host does not know yet (async scheduling): the runner substitutes the
# previous step's sampled id on the device. Never a real token id, never a stop id.
PLACEHOLDER_TOKEN = -1


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
    sampling: Any = None         # nv_engine.sampling_batch's batch for the S sampling rows
    prev_rows: np.ndarray | None = None   # [K] int64 rows of input_ids that are placeholders ...
    prev_src: np.ndarray | None = None    # [K] int64 ... for the previous step's sampled id at this index

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


class BlockTableCache:
    """Per-sequence rows of block ids, kept in sync with `Sequence.block_table` incrementally."""

    def __init__(self, max_blocks_per_seq: int, initial_rows: int = 64) -> None:
        self.max_blocks = max_blocks_per_seq
        self.table = np.zeros((initial_rows, max_blocks_per_seq), dtype=np.int32)  # [R, M]
        self.num_written = [0] * initial_rows      # per row: leading entries in sync
        self.last_written = [-1] * initial_rows    # per row: table[row, num_written - 1]
        self.row_of: dict[int, int] = {}           # seq_id -> row
        self.free_rows = list(range(initial_rows - 1, -1, -1))

    def _grow(self) -> None:
        old = self.table.shape[0]
        self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.num_written += [0] * old
        self.last_written += [-1] * old
        self.free_rows.extend(range(2 * old - 1, old - 1, -1))

    def release(self, seq_id: int) -> None:
        """Forget a sequence (finished, aborted or preempted: its blocks were freed)."""
        row = self.row_of.pop(seq_id, None)
        if row is not None:
            self.num_written[row] = 0
            self.free_rows.append(row)

    def row(self, seq: Sequence) -> int:
        """The sequence's row, brought up to date with its block table."""
        row = self.row_of.get(seq.seq_id)
        blocks = seq.block_table
        num_blocks = len(blocks)
        if row is None:
            if not self.free_rows:
                self._grow()
            row = self.row_of[seq.seq_id] = self.free_rows.pop()
            written = 0
        else:
            written = self.num_written[row]
            if num_blocks == written and (not written or self.last_written[row] == blocks[-1]):
                return row                       # unchanged (most decode steps)
            # A table that shrank or whose last written entry changed was replaced: rewrite it all.
            if num_blocks < written or (written and self.last_written[row] != blocks[written - 1]):
                written = 0
        if num_blocks > self.max_blocks:
            raise AssertionError(f"sequence {seq.seq_id} holds {num_blocks} blocks > {self.max_blocks}")
        if num_blocks > written:
            self.table[row, written:num_blocks] = blocks[written:]
        self.num_written[row] = num_blocks
        self.last_written[row] = blocks[-1] if num_blocks else -1
        return row


class StepBuilder:
    """Builds StepInputs; owns the block-table cache. One per engine (rank 0)."""

    def __init__(self, block_size: int, max_blocks_per_seq: int) -> None:
        self.block_size = block_size
        self.blocks = BlockTableCache(max_blocks_per_seq)

    def release(self, seq_id: int) -> None:
        self.blocks.release(seq_id)

    def build(self, out: SchedulerOutput, sampling: Any = None,
              prev_index: dict[int, int] | None = None) -> StepInput:
        """prev_index: seq_id -> row in the previous step's sampled ids, for sequences whose last
        token is still PLACEHOLDER_TOKEN (scheduled before the previous step's ids came back)."""
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
            max_seqlen_k=max_seqlen_k, sampling=sampling, prev_rows=prev_rows, prev_src=prev_src)
