"""InputStager: a StepInput's arrays -> device tensors and the ForwardContext over them, in two
layouts: the fixed decode layout that CUDA graphs replay on (with each row's temperature, seed and
sampling position, which the LM head's graphs draw with), and a compact eager layout for any step
(its ids, positions and slots optionally padded, for the CUDA graphs of mixed steps).

Two StagingBuffers (int64 and int32) each take one host -> device copy per step."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from nv_engine.core.step import StepInput
from nv_engine.runner.staging_buffer import StagingBuffer
from nv_engine.runner.verify_layout import VerifyRows
from nv_kernels import AttentionBackend
from nv_layers.forward_context import ForwardContext

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_NO_ROWS = np.zeros((0, 0), dtype=np.int64)


class DrawInputs(NamedTuple):
    """A decode step's per-row inputs of a temperature-only draw (runner.head_graphs), [padded] each."""

    temperatures: torch.Tensor            # float32; 0 = greedy (and on padding rows)
    seeds: torch.Tensor                   # int64
    positions: torch.Tensor               # int64: the index of the token being sampled (output count)


class StagedStep(NamedTuple):
    ctx: ForwardContext                   # over the staged tensors below
    ids: torch.Tensor                     # [T] (or [padded]) input ids
    positions: torch.Tensor               # [T] (or [padded])
    prev_rows: torch.Tensor | None        # [K] rows of ids to take from the previous step's samples
    prev_src: torch.Tensor | None         # [K] their index in that step's sampled ids
    draw: DrawInputs | None = None        # decode layout only
    logits_rows: torch.Tensor | None = None   # verify layout only: [S * (K+1)] hidden rows the verifier reads
    row_of_token: np.ndarray | None = None    # verify layout only: [T] the staged row of each compact-layout token
    drafts: tuple[torch.Tensor, torch.Tensor] | None = None   # a step with drafts: (draft_ids [S, K], num_drafts [S])


class InputStager:
    def __init__(self, backend: AttentionBackend, *, max_model_len: int, max_blocks_per_seq: int,
                 max_num_batched_tokens: int, max_num_seqs: int, device: torch.device,
                 num_speculative_tokens: int = 0) -> None:
        self.backend = backend
        self.max_model_len = max_model_len
        self.max_blocks = max_blocks_per_seq
        max_tokens = max(max_num_batched_tokens, max_num_seqs)
        # int64: ids, positions, slots [T each] + logits indices [S] + previous-step gather [K, K];
        # decode also seeds and sampling positions [2, B]; a step verifying k drafts per sequence has
        # S * (k+1) logits indices and S * (k+1) draft ids and counts (its ids, positions and slots stay within the
        # token budget)
        verified_rows = 2 * max_num_seqs * (num_speculative_tokens + 1) if num_speculative_tokens else 0
        self.i64 = StagingBuffer(torch.int64, 3 * max_tokens + 5 * max_num_seqs + verified_rows + 8, device)
        # int32: seq lens [B], cu_seqlens [B+1] (decode: temperatures' float32 bits [B]), block tables [B, M];
        # or a dummy mixed step's [T], [T+1], [T, 1]
        self.i32 = StagingBuffer(torch.int32, max(2 * max_num_seqs + 1 + max_num_seqs * max_blocks_per_seq,
                                                  3 * max_tokens + 1) + 8, device)

    def stage_decode(self, padded: int, step: StepInput | None, dummy: bool = False) -> StagedStep:
        """Stage a decode batch padded to `padded` rows in the fixed graph layout:
        int64 [ids | positions | slots | seeds, sampling positions (2 x padded)],
        int32 [seq_lens | block_tables (padded x max_blocks) | temperatures (float32 bits)].
        Padding rows have slot -1, length 0 and temperature 0. The previous-step gather indices (if
        any) follow. A step without a SamplingBatch (greedy) stages temperature 0 everywhere.
        dummy=True (graph capture, step None): every row a one-token context in block 0, nothing
        written to the cache."""
        i64, i32, max_blocks = self.i64, self.i32, self.max_blocks
        i64.begin()
        i32.begin()
        if dummy or step is None:
            ids = i64.put(_EMPTY, padded, fill=0)
            positions = i64.put(_EMPTY, padded, fill=0)
            slots = i64.put(_EMPTY, padded, fill=-1)
            seq_lens = i32.put(_EMPTY, padded, fill=1)
            block_tables = i32.put_rows(np.zeros((padded, max_blocks), dtype=np.int32), padded, max_blocks)
        else:
            ids = i64.put(step.input_ids, padded, fill=0)
            positions = i64.put(step.positions, padded, fill=0)
            slots = i64.put(step.slot_mapping, padded, fill=-1)
            seq_lens = i32.put(step.seq_lens, padded, fill=0)
            block_tables = i32.put_rows(step.block_tables, padded, max_blocks)
        sampling = None if step is None else step.sampling
        if sampling is None:
            seeds_positions = i64.put_rows(_NO_ROWS, 2, padded)            # [2, padded]: unread where greedy
            temperatures = i32.put(_EMPTY_I32, padded, fill=0)
        else:
            seeds_positions = i64.put_rows(sampling.seeds_positions, 2, padded)
            temperatures = i32.put(np.asarray(sampling.arrays["temperatures"], np.float32).view(np.int32),
                                 padded, fill=0)
        draw = DrawInputs(temperatures.view(torch.float32), seeds_positions[0], seeds_positions[1])
        prev_rows, prev_src = self._stage_prev(step)
        i64.upload()
        i32.upload()
        ctx = ForwardContext(
            is_decode=True, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables,
            cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=self.max_model_len,
            logits_indices=None, backend=self.backend)
        return StagedStep(ctx, ids, positions, prev_rows, prev_src, draw)

    def stage_verify(self, padded: int, query_len: int, step: StepInput | None = None,
                     rows: VerifyRows | None = None) -> StagedStep:
        """Stage a verify step (runner.verify_layout) padded to `padded` sequences of query_len rows, in the fixed
        layout its CUDA graphs replay on: int64 [ids | positions | slots (padded x Q each) | logits rows],
        int32 [seq_lens (padded) | block_tables (padded x max_blocks)]. Padding sequences have slot -1 and length
        0. step None (graph capture): every sequence Q tokens in block 0, nothing written to the cache."""
        i64, i32, max_blocks = self.i64, self.i32, self.max_blocks
        n = padded * query_len
        i64.begin()
        i32.begin()
        if step is None or rows is None:
            ids = i64.put(_EMPTY, n, fill=0)
            positions = i64.put(_EMPTY, n, fill=0)
            slots = i64.put(_EMPTY, n, fill=-1)
            seq_lens = i32.put(_EMPTY, padded, fill=query_len)
            block_tables = i32.put_rows(np.zeros((padded, max_blocks), dtype=np.int32), padded, max_blocks)
            logits_rows = prev_rows = prev_src = None
        else:
            ids = i64.put(rows.input_ids, n, fill=0)
            positions = i64.put(rows.positions, n, fill=0)
            slots = i64.put(rows.slot_mapping, n, fill=-1)
            logits_rows = i64.put(rows.logits_rows)
            prev_rows = prev_src = None
            if step.prev_rows is not None and step.prev_src is not None and len(step.prev_rows):
                prev_rows, prev_src = i64.put(rows.row_of_token[step.prev_rows]), i64.put(step.prev_src)
            seq_lens = i32.put(step.seq_lens, padded, fill=0)
            block_tables = i32.put_rows(step.block_tables, padded, max_blocks)
        drafts = self._stage_drafts(step)
        i64.upload()
        i32.upload()
        ctx = ForwardContext(
            is_decode=True, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables, cu_seqlens_q=None,
            max_seqlen_q=query_len, max_seqlen_k=self.max_model_len, logits_indices=None, backend=self.backend,
            query_len=query_len)
        return StagedStep(ctx, ids, positions, prev_rows, prev_src, logits_rows=logits_rows,
                          row_of_token=None if rows is None else rows.row_of_token, drafts=drafts)

    def stage_eager(self, step: StepInput, padded: int | None = None) -> StagedStep:
        """Stage any step in a compact layout: int64 [ids | positions | slots | logits indices],
        int32 [seq_lens | cu_seqlens | block_tables (B x M)]. padded (the CUDA graphs of mixed steps): ids,
        positions and slots take `padded` rows each (tail: id 0, position 0, slot -1), so their addresses
        depend only on `padded`; the rest is read by eager kernels only."""
        i64, i32 = self.i64, self.i32
        i64.begin()
        i32.begin()
        ids = i64.put(step.input_ids, padded, fill=0)
        positions = i64.put(step.positions, padded, fill=0)
        slots = i64.put(step.slot_mapping, padded, fill=-1)
        logits_indices = None if step.is_decode else i64.put(step.logits_indices)
        seq_lens = i32.put(step.seq_lens)
        cu_seqlens = i32.put(step.cu_seqlens_q)
        batch, cols = step.block_tables.shape
        block_tables = i32.put_rows(step.block_tables, batch, cols)
        prev_rows, prev_src = self._stage_prev(step)
        drafts = self._stage_drafts(step)
        i64.upload()
        i32.upload()
        ctx = ForwardContext(
            is_decode=step.is_decode, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables,
            cu_seqlens_q=None if step.is_decode else cu_seqlens, max_seqlen_q=step.max_seqlen_q,
            max_seqlen_k=step.max_seqlen_k, logits_indices=logits_indices, backend=self.backend)
        return StagedStep(ctx, ids, positions, prev_rows, prev_src, drafts=drafts)

    def stage_dummy_mixed(self, padded: int) -> StagedStep:
        """The layout of stage_eager(step, padded) for capturing a mixed-step graph: `padded` one-token
        sequences in block 0, nothing written to the cache (slot -1)."""
        i64, i32 = self.i64, self.i32
        i64.begin()
        i32.begin()
        ids = i64.put(_EMPTY, padded, fill=0)
        positions = i64.put(_EMPTY, padded, fill=0)
        slots = i64.put(_EMPTY, padded, fill=-1)
        seq_lens = i32.put(_EMPTY, padded, fill=1)
        cu_seqlens = i32.put(np.arange(padded + 1, dtype=np.int32))
        block_tables = i32.put_rows(np.zeros((padded, 1), dtype=np.int32), padded, 1)
        i64.upload()
        i32.upload()
        ctx = ForwardContext(
            is_decode=False, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables,
            cu_seqlens_q=cu_seqlens, max_seqlen_q=1, max_seqlen_k=1, logits_indices=None, backend=self.backend)
        return StagedStep(ctx, ids, positions, None, None)

    def _stage_drafts(self, step: StepInput | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A verify step's draft ids [S, K] and counts [S], staged with the step's other inputs (one copy, no host
        wait behind the forward, which a pageable copy after it would add)."""
        if step is None or step.draft_ids is None or step.num_drafts is None:
            return None
        num_seqs, width = step.draft_ids.shape
        return self.i64.put_rows(step.draft_ids, num_seqs, width), self.i64.put(step.num_drafts)

    def _stage_prev(self, step: StepInput | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if step is None or step.prev_rows is None or step.prev_src is None or len(step.prev_rows) == 0:
            return None, None
        return self.i64.put(step.prev_rows), self.i64.put(step.prev_src)
