"""BlockTableCache: per-sequence rows of block ids in one numpy array, kept in sync with each
sequence's block table incrementally (a decode step adds at most one block), so a step gathers its
[B, M] table with one `np.take`. Idea from vLLM v1's persistent block table."""
from __future__ import annotations

import numpy as np

from nv_kvcache import Sequence


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

    def rows(self, seqs: list[Sequence]) -> list[int]:
        """`row(seq)` of each sequence, with the common case (a row already in sync) inline."""
        row_of, num_written, last_written = self.row_of, self.num_written, self.last_written
        rows: list[int] = []
        for seq in seqs:
            row = row_of.get(seq.seq_id)
            if row is not None:
                blocks = seq.block_table
                written = num_written[row]
                if len(blocks) == written and (not written or last_written[row] == blocks[-1]):
                    rows.append(row)
                    continue
            rows.append(self.row(seq))
        return rows

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
