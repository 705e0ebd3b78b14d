"""InputStager: a step verifying k drafts per sequence at a full token budget stages S * (k+1) logits rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nv_engine.core.step import StepInput
from nv_engine.runner.input_stager import InputStager
from nv_kernels import get_backend

SEQS, K = 64, 8
BUDGET = SEQS * (K + 1)                # every sequence: its last token + K drafts


def verify_step() -> StepInput:
    """SEQS sequences of 50 cached tokens, each computing 1 + K tokens; K+1 logits rows each."""
    q_lens = np.full(SEQS, K + 1, dtype=np.int64)
    cu_seqlens = np.zeros(SEQS + 1, dtype=np.int32)
    np.cumsum(q_lens, out=cu_seqlens[1:])
    positions = np.tile(np.arange(50, 50 + K + 1, dtype=np.int64), SEQS)
    tables = np.arange(SEQS * 4, dtype=np.int32).reshape(SEQS, 4)
    return StepInput(
        input_ids=np.ones(BUDGET, dtype=np.int64), positions=positions,
        slot_mapping=np.arange(BUDGET, dtype=np.int64), seq_lens=np.full(SEQS, 50 + K + 1, dtype=np.int32),
        cu_seqlens_q=cu_seqlens, block_tables=tables, logits_indices=np.arange(BUDGET, dtype=np.int64),
        is_decode=False, max_seqlen_q=K + 1, max_seqlen_k=50 + K + 1,
        draft_ids=np.zeros((SEQS, K), dtype=np.int64), num_drafts=np.full(SEQS, K, dtype=np.int64))


def stager(num_speculative_tokens: int) -> InputStager:
    return InputStager(get_backend("torch", torch.device("cpu")), max_model_len=64, max_blocks_per_seq=4,
                       max_num_batched_tokens=BUDGET, max_num_seqs=SEQS, device=torch.device("cpu"),
                       num_speculative_tokens=num_speculative_tokens)


def test_eight_drafts_at_a_full_budget_fit():
    staged = stager(K).stage_eager(verify_step())
    assert staged.ctx.logits_indices is not None and staged.ctx.logits_indices.shape == (BUDGET,)
    assert staged.ids.shape == (BUDGET,)


def test_a_stager_sized_without_drafts_overflows():
    with pytest.raises(AssertionError, match="staging buffer overflow"):
        stager(0).stage_eager(verify_step())
