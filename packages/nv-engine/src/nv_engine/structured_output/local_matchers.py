"""LocalMatchers: the grammar matchers that live in the engine's process (StructuredOutputManager's, for
the requests it does not place in the matcher process): one xgrammar GrammarMatcher per sequence, one
batched fill per step, one accept per row.

Fills go through xgrammar.BatchGrammarMatcher (rows in parallel threads, see fill_threads_for) into one of
two preallocated buffers (alternating, so the engine may fill step N+1's while step N's is being sent);
with pin_memory (the runner shares this process and runs on CUDA) the buffers are page-locked, so the
runner copies them to the device as they are.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from nv_engine.structured_output.compiler import import_xgrammar

if TYPE_CHECKING:
    import xgrammar

    from nv_engine.core.engine_sequence import EngineSequence

# Threads of one batched bitmask fill: one per ROWS_PER_FILL_THREAD rows, at most half the cores this
# process may run on and MAX_FILL_THREADS (fill_threads_for; on 2 cores every fill stays on one thread).
# A fill on more than one thread starts its threads at each call, while a JSON-schema row over a
# 49k-token vocabulary fills in 2-12 us: inside an engine step 4 threads filled ~54 rows in 0.50-0.58 ms
# against 0.31-0.35 ms on one (16 cores), so threads pay only for large batches.
ROWS_PER_FILL_THREAD = 128
MAX_FILL_THREADS = 8


def fill_threads_for(num_rows: int, num_cores: int) -> int:
    """Threads of a batched fill of num_rows rows on a process that may run on num_cores cores."""
    limit = max(1, min(MAX_FILL_THREADS, num_cores // 2))
    return max(1, min(limit, -(-num_rows // ROWS_PER_FILL_THREAD)))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LocalMatchers:
    """grammar_of(seq): the compiled grammar a sequence's new matcher takes here (None: the sequence has
    none here); skip(seq): a row to leave out of a fill (finished, or its grammar ended)."""

    def __init__(self, bitmask_width: int, pin_memory: bool,
                 grammar_of: Callable[[EngineSequence], xgrammar.CompiledGrammar | None],
                 skip: Callable[[EngineSequence], bool]) -> None:
        self.bitmask_width = bitmask_width
        self.pin_memory = pin_memory
        self._grammar_of = grammar_of
        self._skip = skip
        self._matchers: dict[int, xgrammar.GrammarMatcher] = {}    # seq id -> its matcher
        self._batch_matchers: dict[int, xgrammar.BatchGrammarMatcher] = {}   # by threads
        self.fill_threads: int | None = None     # threads of every batched fill (None: by the rows and cores)
        self._num_cores = usable_cores()
        self._bitmasks: list[np.ndarray] = []      # two [rows, W] int32 buffers, used in turn
        self._next_bitmask = 0

    def fill(self, seqs: Sequence[EngineSequence]) -> np.ndarray | None:
        """[S, W] int32 for the step's rows (rows without a matcher here allow every token) in one of the
        two buffers; None when no row has a matcher here."""
        matchers, rows = self._matchers_for(seqs)
        if not matchers:
            return None
        bitmask = self._bitmask_buffer(len(seqs))
        if len(matchers) < len(seqs):
            bitmask[...] = -1
        return self._fill(self._batch_matcher(len(matchers)), bitmask, matchers, rows)

    def fill_rows(self, bitmask: np.ndarray, seqs: Sequence[EngineSequence]) -> None:
        """Fill only the rows of `bitmask` ([S, W], another's buffer) whose matchers live here."""
        matchers, rows = self._matchers_for(seqs)
        if matchers:
            self._fill(self._batch_matcher(len(matchers)), bitmask, matchers, rows)

    def accept(self, seq_id: int, token_id: int) -> bool | None:
        """Advance a sequence's matcher: whether the grammar took the token; None without a matcher here."""
        matcher = self._matchers.get(seq_id)
        return None if matcher is None else matcher.accept_token(token_id)

    def remove(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            self._matchers.pop(seq_id, None)

    def _matchers_for(self, seqs: Sequence[EngineSequence]) -> tuple[list[xgrammar.GrammarMatcher], list[int] | None]:
        """The matchers to fill for the step's rows, and their rows (None: rows 0..k-1, the usual case,
        which xgrammar then needs no index list for: converting one costs about as much as the fill of
        64 rows)."""
        matchers, rows = [], []
        get_matcher, skip = self._matchers.get, self._skip
        for row, seq in enumerate(seqs):
            matcher = get_matcher(seq.seq_id)
            if matcher is None:
                grammar = self._grammar_of(seq)
                if grammar is None:
                    continue
                matcher = self._matchers[seq.seq_id] = import_xgrammar().GrammarMatcher(grammar)
            if not skip(seq):
                matchers.append(matcher)
                rows.append(row)
        return matchers, None if not rows or rows[-1] == len(rows) - 1 else rows

    @staticmethod
    def _fill(filler: xgrammar.BatchGrammarMatcher, bitmask: np.ndarray, matchers: list[xgrammar.GrammarMatcher],
              rows: list[int] | None) -> np.ndarray:
        """Fill the matchers' rows of `bitmask` ([S, W])."""
        filler.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        return bitmask

    def _bitmask_buffer(self, num_rows: int) -> np.ndarray:
        if not self._bitmasks or self._bitmasks[0].shape[0] < num_rows:
            self._bitmasks = [self._new_bitmask(num_rows) for _ in range(2)]
        self._next_bitmask = 1 - self._next_bitmask
        return self._bitmasks[self._next_bitmask][:num_rows]

    def _new_bitmask(self, num_rows: int) -> np.ndarray:
        """[num_rows, W] int32, page-locked with pin_memory."""
        if not self.pin_memory:
            return np.empty((num_rows, self.bitmask_width), dtype=np.int32)
        # only an engine whose runner shares its process on CUDA pins (torch is loaded there)
        import torch

        return torch.empty((num_rows, self.bitmask_width), dtype=torch.int32, pin_memory=True).numpy()

    def _batch_matcher(self, num_rows: int) -> xgrammar.BatchGrammarMatcher:
        """The batched filler of num_rows rows: fill_threads threads, else fill_threads_for the rows."""
        threads = self.fill_threads or fill_threads_for(num_rows, self._num_cores)
        matcher = self._batch_matchers.get(threads)
        if matcher is None:
            matcher = self._batch_matchers[threads] = import_xgrammar().BatchGrammarMatcher(max_threads=threads)
        return matcher
