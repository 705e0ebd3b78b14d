"""DraftModelPlanner: the host side of draft_model speculative decoding.

The draft model shares the target's block tables and slot mapping (its own KV tensors, same blocks), so the one
BlockManager's prefix caching, preemption and freeing hold for both. What the draft has computed lags the target
in two ways, tracked per sequence as EngineSequence.draft_computed_tokens (positions [0, f) hold valid draft KV):
- pure-decode steps without drafts (large batches, the decode CUDA graphs) skip the draft model entirely;
- after a verified step whose drafts were all accepted, the last draft's KV is missing (the draft proposed it but
  never took it as input).
- steps without drafts may be pipelined (adaptive_draft_length stopped every sequence's drafting, or more than
  max_batch_size sequences run): the token a sequence's last step sampled is a placeholder on the host then, so
  such a step leaves it out of the catch-up.
Every step the draft runs in (a step with drafts, or any step that is not a pure decode) first catches each
scheduled sequence up: a prefill-layout forward over its tokens [f, end) (end: the target's last non-draft token
of the step + 1), in pieces of at most `max_catchup_tokens` tokens. The logits of a drafting sequence's last
token give draft 1; decode-layout forwards j = 1 .. K-1 then feed draft j at position end - 1 + j to get draft
j + 1 (vLLM's draft-model proposer does the same chain of greedy decodes). All these positions lie in blocks the
scheduler gave the step (the drafts' own slots). After the step, draft j's KV is valid iff draft j was accepted.
So in steady decoding a catch-up is 1 token per sequence (a draft was rejected) or 2 (all were accepted: draft K
and the bonus token), which the runner replays in a CUDA graph of 1 + K rows per sequence (runner.catchup_graphs).

A sequence first scheduled with prefix-cache hits trusts the cached blocks' draft KV (f = num_computed_tokens):
it is the draft's own output for those tokens unless the sequence that wrote them lagged (a decode block written
in steps without drafts), which costs acceptance, never correctness: the target verifies every draft. A preempted
sequence (num_computed_tokens dropped below f) recomputes from its num_computed_tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.core.step import PLACEHOLDER_TOKEN, DraftInputs, StepInput
from nv_kvcache import SchedulerOutput

# one piece of a catch-up forward: (entry index b in the step, first position, end position, sampling index of a
# drafting sequence whose draft 1 this piece's last row predicts, else -1)
_Piece = tuple[int, int, int, int]


class DraftModelPlanner:
    def __init__(self, num_speculative_tokens: int, block_size: int, max_catchup_tokens: int) -> None:
        if num_speculative_tokens < 1 or block_size < 1 or max_catchup_tokens < 1:
            raise ValueError(f"DraftModelPlanner needs positive sizes, got k={num_speculative_tokens}, "
                             f"block_size={block_size}, max_catchup_tokens={max_catchup_tokens}")
        self.num_speculative_tokens = num_speculative_tokens
        self.block_size = block_size
        self.max_catchup_tokens = max_catchup_tokens

    def propose(self, token_ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """The scheduler's proposer: min(k, max_tokens) placeholders, which the draft model fills in on the
        device in the step that verifies them (greedy drafts: their number is known before they are)."""
        k = self.num_speculative_tokens if max_tokens is None else min(self.num_speculative_tokens, max_tokens)
        return [PLACEHOLDER_TOKEN] * max(k, 0)

    def plan(self, out: SchedulerOutput, step: StepInput) -> DraftInputs | None:
        """The draft model's forwards for this step (None: a step without drafts with nothing to catch up, e.g. a
        pure decode, where the draft lags). Advances each covered sequence's draft_computed_tokens to its end
        (accepted() adds the accepted drafts). A step without drafts may be pipelined (scheduled before the last
        step's ids are on the host): a sequence's trailing placeholder token is left for a later catch-up."""
        drafting = step.draft_ids is not None
        if not drafting and out.is_pure_decode:
            return None
        width = 0 if step.draft_ids is None else int(step.draft_ids.shape[1])    # K of the [S, K] drafts
        pieces: list[_Piece] = []
        proposals: list[list[tuple[int, int, int]]] = [[] for _ in range(max(width - 1, 0))]  # (b, s, position)
        target_rows: list[int] = []
        draft_index: list[int] = []
        sample = 0
        for b, entry in enumerate(out.scheduled):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the engine core schedules only these
            s = -1
            if entry.samples:
                s, sample = sample, sample + 1
            computed = seq.num_computed_tokens
            num_drafts = len(seq.spec_token_ids) if drafting else 0
            end = computed + entry.num_new_tokens - num_drafts
            if not drafting and seq.token_ids[end - 1] == PLACEHOLDER_TOKEN:
                end -= 1      # a pipelined step: the last step's token is not on the host yet; caught up later
            start = computed if seq.draft_computed_tokens < 0 else min(seq.draft_computed_tokens, computed)
            pieces.append((b, start, end, s if num_drafts else -1))
            seq.draft_computed_tokens = end
            first_row = int(step.cu_seqlens_q[b]) + end - computed   # the target's row of draft 1
            for j in range(1, num_drafts + 1):
                target_rows.append(first_row + j - 1)
                draft_index.append(s * width + j - 1)
                if j < num_drafts:
                    proposals[j - 1].append((b, s, end - 1 + j))
        if not drafting and all(start >= end for _, start, end, _ in pieces):
            return None
        catchup, catchup_seqs = [], []
        for chunk in self._chunks(pieces):
            inputs, seqs = self._catchup_input(out, step.block_tables, chunk)
            catchup.append(inputs)
            catchup_seqs.append(seqs)
        decode_inputs = [self._proposal_input(step.block_tables, rows) for rows in proposals]
        return DraftInputs(catchup, catchup_seqs, decode_inputs,
                           [np.array([s for _, s, _ in rows], dtype=np.int64) for rows in proposals],
                           np.array(target_rows, dtype=np.int64), np.array(draft_index, dtype=np.int64))

    @staticmethod
    def accepted(out: SchedulerOutput, runs: Sequence[Sequence[int]]) -> None:
        """After a verified step (runs aligned with out.sampling, before Scheduler.postprocess_runs clears the
        drafts): the KV the draft wrote for drafts 1 .. min(accepted, K-1) is valid."""
        for entry, run in zip(out.sampling, runs, strict=True):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]
            num_drafts = len(seq.spec_token_ids)
            if num_drafts:
                seq.draft_computed_tokens += min(max(len(run) - 1, 0), num_drafts - 1)

    def _chunks(self, pieces: list[_Piece]) -> list[list[_Piece]]:
        """The pieces split into forwards of at most max_catchup_tokens tokens; a split piece predicts its draft
        only from its last part."""
        chunks: list[list[_Piece]] = []
        current: list[_Piece] = []
        room = self.max_catchup_tokens
        for b, start, end, s in pieces:
            while start < end:
                take = min(end - start, room)
                current.append((b, start, start + take, s if start + take == end else -1))
                start += take
                room -= take
                if room == 0:
                    chunks.append(current)
                    current, room = [], self.max_catchup_tokens
        if current:
            chunks.append(current)
        return chunks

    def _catchup_input(self, out: SchedulerOutput, tables: np.ndarray,
                       chunk: list[_Piece]) -> tuple[StepInput, np.ndarray]:
        """A prefill-layout StepInput over the chunk's pieces, and the sampling index of each logits row."""
        bs = self.block_size
        entries = np.array([b for b, _, _, _ in chunk], dtype=np.int64)                  # [P]
        starts = np.array([start for _, start, _, _ in chunk], dtype=np.int64)           # [P]
        ends = np.array([end for _, _, end, _ in chunk], dtype=np.int64)                 # [P]
        seqs = np.array([s for _, _, _, s in chunk], dtype=np.int64)                     # [P]
        q_lens = ends - starts                                                           # [P]
        ids: list[int] = []
        for b, start, end, _ in chunk:
            ids.extend(out.scheduled[b].seq.token_ids[start:end])
        cu_seqlens = np.zeros(len(chunk) + 1, dtype=np.int32)                            # [P+1]
        np.cumsum(q_lens, out=cu_seqlens[1:])
        offsets = np.arange(int(q_lens.sum()), dtype=np.int64) - np.repeat(cu_seqlens[:-1], q_lens)
        positions = np.repeat(starts, q_lens) + offsets                                  # [T]
        block_index, offset = np.divmod(positions, bs)
        slots = tables[np.repeat(entries, q_lens), block_index].astype(np.int64) * bs + offset   # [T]
        max_len = int(ends.max())
        logits_indices = (cu_seqlens[1:].astype(np.int64) - 1)[seqs >= 0]               # [D]
        return StepInput(
            input_ids=np.array(ids, dtype=np.int64), positions=positions, slot_mapping=slots,
            seq_lens=ends.astype(np.int32), cu_seqlens_q=cu_seqlens,
            block_tables=tables[entries, :-(-max_len // bs)], logits_indices=logits_indices, is_decode=False,
            max_seqlen_q=int(q_lens.max()), max_seqlen_k=max_len), seqs[seqs >= 0]

    def _proposal_input(self, tables: np.ndarray, rows: list[tuple[int, int, int]]) -> StepInput:
        """A decode-layout StepInput of one token per (entry, sampling index, position) row; its ids are filled
        on the device with the previous forward's drafts."""
        bs = self.block_size
        entries = np.array([b for b, _, _ in rows], dtype=np.int64)                      # [D]
        positions = np.array([p for _, _, p in rows], dtype=np.int64)                    # [D]
        block_index, offset = np.divmod(positions, bs)
        seq_lens = (positions + 1).astype(np.int32)
        max_len = int(seq_lens.max()) if len(rows) else 1
        return StepInput(
            input_ids=np.zeros(len(rows), dtype=np.int64), positions=positions,
            slot_mapping=tables[entries, block_index].astype(np.int64) * bs + offset, seq_lens=seq_lens,
            cu_seqlens_q=np.arange(len(rows) + 1, dtype=np.int32),
            block_tables=tables[entries, :-(-max_len // bs)], logits_indices=np.arange(len(rows), dtype=np.int64),
            is_decode=True, max_seqlen_q=1, max_seqlen_k=max_len)
