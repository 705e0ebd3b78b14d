"""MatcherProcessChild: the loop of the grammar-matcher process (MatcherProcess is its parent's side).

It owns one xgrammar GrammarMatcher per sequence with a grammar and answers one job per engine step,
received on a pipe: register the grammars and matchers the job names, advance the matchers by the
sampled tokens it carries, forget the sequences it removes, then fill the step's token bitmask into
the shared buffer the job names and reply (job id, the sequences whose sampled token the grammar
rejected, an error message or None). The bitmask is written before the reply is sent, so a parent
that read the reply reads a complete bitmask.

Grammars arrive serialized (CompiledGrammar.serialize_json; the tokenizer's TokenizerInfo once, with
the first job that carries a grammar) and are kept by the parent's key id until the parent drops them.
The process holds no GIL its parent needs: that is why it exists (see MatcherProcess).
"""
from __future__ import annotations

import mmap
import os
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import xgrammar

# A job, as the parent sends it (tuple fields, pickled; None ends the process):
# (job id, buffer index, tokenizer info json | None, [(key id, grammar json)], [key id to drop],
#  [(seq id, key id) of new matchers], [seq id accepting], [token id], [seq id to remove],
#  [seq id per bitmask row, -1 for a row that allows every token])
Job = tuple[int, int, "str | None", list[tuple[int, str]], list[int], list[tuple[int, int]], list[int], list[int],
            list[int], list[int]]


class MatcherProcessChild:
    def __init__(self, conn: Connection, buffer_path: str, max_rows: int, width: int) -> None:
        import xgrammar

        self.xgrammar = xgrammar
        self.conn = conn
        with open(buffer_path, "r+b") as f:
            self._mapping = mmap.mmap(f.fileno(), 2 * max_rows * width * 4)
        os.unlink(buffer_path)   # both sides have it mapped now: nothing is left behind when either ends
        # [2, max_rows, width] int32: the job's buffer index picks the half
        self.bitmasks = np.frombuffer(self._mapping, dtype=np.int32).reshape(2, max_rows, width)
        self.tokenizer_info: xgrammar.TokenizerInfo | None = None
        self.grammars: dict[int, xgrammar.CompiledGrammar] = {}
        self.matchers: dict[int, xgrammar.GrammarMatcher] = {}
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=1)

    @staticmethod
    def main(conn: Connection, buffer_path: str, max_rows: int, width: int) -> None:
        """The process's target: attach to the shared buffer, say ready, serve jobs until None."""
        child = MatcherProcessChild(conn, buffer_path, max_rows, width)
        conn.send("ready")
        child.run()

    def run(self) -> None:
        while True:
            try:
                job = self.conn.recv()
            except EOFError:          # the parent is gone
                return
            if job is None:
                return
            try:
                rejected = self.handle(job)
            except Exception as exc:   # the parent raises it in its step; the process serves on
                self.conn.send((job[0], [], f"{type(exc).__name__}: {exc}"))
                continue
            self.conn.send((job[0], rejected, None))

    def handle(self, job: Job) -> list[int]:
        """Run one job; the seq ids whose token the grammar rejected (their matchers did not move)."""
        (_, buffer, tokenizer_json, grammars, drop_keys, new_matchers, accept_ids, accept_tokens, removed,
         rows) = job
        xgrammar = self.xgrammar
        if tokenizer_json is not None:
            self.tokenizer_info = xgrammar.TokenizerInfo.deserialize_json(tokenizer_json)
        for key_id, grammar_json in grammars:
            if self.tokenizer_info is None:
                raise RuntimeError("a grammar arrived before the tokenizer's info")
            self.grammars[key_id] = xgrammar.CompiledGrammar.deserialize_json(grammar_json, self.tokenizer_info)
        for key_id in drop_keys:
            self.grammars.pop(key_id, None)
        for seq_id, key_id in new_matchers:
            self.matchers[seq_id] = xgrammar.GrammarMatcher(self.grammars[key_id])
        rejected = []
        get = self.matchers.get
        for seq_id, token_id in zip(accept_ids, accept_tokens, strict=True):
            matcher = get(seq_id)
            if matcher is not None and not matcher.is_terminated() and not matcher.accept_token(token_id):
                rejected.append(seq_id)
        for seq_id in removed:
            self.matchers.pop(seq_id, None)
        self.fill(self.bitmasks[buffer, :len(rows)], rows)
        return rejected

    def fill(self, bitmask: np.ndarray, rows: list[int]) -> None:
        """Fill `bitmask` ([len(rows), W]): a row's matcher's mask, or every token allowed (-1 rows, and
        terminated matchers)."""
        matchers: list[xgrammar.GrammarMatcher] = []
        indices: list[int] = []
        get = self.matchers.get
        for row, seq_id in enumerate(rows):
            matcher = get(seq_id) if seq_id >= 0 else None
            if matcher is not None and not matcher.is_terminated():
                matchers.append(matcher)
                indices.append(row)
        if len(indices) < len(rows):
            bitmask[...] = -1
        if matchers:
            # rows 0..k-1 (every row has a grammar, the usual case): no index list to convert
            self.batch.batch_fill_next_token_bitmask(
                matchers, bitmask, None if indices[-1] == len(indices) - 1 else indices)
