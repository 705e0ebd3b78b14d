"""VerifyLayout and InputStager.stage_verify: a verify step's compact tokens in the fixed front-padded layout of
the verify CUDA graphs (Q rows per sequence), and the steps that do not fit it."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from nv_engine.core.step import StepInput
from nv_engine.runner.input_stager import InputStager
from nv_engine.runner.verify_layout import VerifyLayout
from nv_kernels import get_backend

Q = 4   # 1 + 3 drafts


def verify_step(num_drafts: list[int], computed: list[int]) -> StepInput:
    """Sequences with `computed` cached tokens, each computing its last token and num_drafts[b] drafts."""
    q_lens = np.array(num_drafts, dtype=np.int64) + 1
    cu = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=cu[1:])
    positions = np.concatenate([np.arange(c, c + n) for c, n in zip(computed, q_lens, strict=True)])
    k = max(num_drafts)
    last = cu[1:] - 1
    rows = np.minimum((last - np.array(num_drafts))[:, None] + np.arange(k + 1), last[:, None]).reshape(-1)
    return StepInput(
        input_ids=np.arange(100, 100 + cu[-1], dtype=np.int64), positions=positions.astype(np.int64),
        slot_mapping=1000 + positions.astype(np.int64), seq_lens=(np.array(computed) + q_lens).astype(np.int32),
        cu_seqlens_q=cu, block_tables=np.zeros((len(q_lens), 2), dtype=np.int32), logits_indices=rows,
        is_decode=False, max_seqlen_q=int(q_lens.max()), max_seqlen_k=int(max(computed)) + Q,
        draft_ids=np.zeros((len(q_lens), k), dtype=np.int64), num_drafts=np.array(num_drafts, dtype=np.int64))


def test_tokens_sit_at_the_end_of_their_rows_behind_front_padding():
    step = verify_step([3, 1, 0], [10, 20, 5])
    layout = VerifyLayout(Q)
    assert layout.fits(step)
    rows = layout.rows(step)
    # sequence 0: rows 0..3 all real; sequence 1: rows 6, 7 real; sequence 2: row 11 real
    np.testing.assert_array_equal(rows.row_of_token, [0, 1, 2, 3, 6, 7, 11])
    np.testing.assert_array_equal(rows.input_ids, [100, 101, 102, 103, 0, 0, 104, 105, 0, 0, 0, 106])
    np.testing.assert_array_equal(rows.positions, [10, 11, 12, 13, 20, 20, 20, 21, 5, 5, 5, 5])
    np.testing.assert_array_equal(rows.slot_mapping, [1010, 1011, 1012, 1013, -1, -1, 1020, 1021, -1, -1, -1, 1005])
    # the verifier reads K+1 = 4 rows per sequence: drafts, bonus, then the last row repeated
    np.testing.assert_array_equal(rows.logits_rows, [0, 1, 2, 3, 6, 7, 7, 7, 11, 11, 11, 11])


def test_steps_that_do_not_fit():
    layout = VerifyLayout(Q)
    step = verify_step([3, 1], [10, 20])
    assert not layout.fits(dataclasses.replace(step, num_drafts=None, draft_ids=None))    # no drafts
    assert not VerifyLayout(3).fits(step)                                                  # 4 tokens > Q = 3
    chunk = dataclasses.replace(step, cu_seqlens_q=np.array([0, 5, 6], dtype=np.int32))    # a prompt chunk
    assert not layout.fits(chunk)


def test_stage_verify_pads_sequences_and_marks_the_context():
    step = verify_step([3, 1, 0], [10, 20, 5])
    stager = InputStager(get_backend("torch", torch.device("cpu")), max_model_len=64, max_blocks_per_seq=2,
                         max_num_batched_tokens=64, max_num_seqs=8, device=torch.device("cpu"),
                         num_speculative_tokens=Q - 1)
    staged = stager.stage_verify(4, Q, step, VerifyLayout(Q).rows(step))     # 3 sequences padded to 4
    assert staged.ctx.is_decode and staged.ctx.query_len == Q
    assert staged.ids.shape == (16,) and staged.ids[12:].tolist() == [0] * 4
    assert staged.ctx.slot_mapping[12:].tolist() == [-1] * 4
    assert staged.ctx.seq_lens.tolist() == [14, 22, 6, 0]
    assert staged.logits_rows is not None and staged.logits_rows.tolist()[:4] == [0, 1, 2, 3]


def test_a_catch_up_of_one_to_q_tokens_per_sequence_is_held():
    """A draft model's catch-up forward (no drafts: 1 or 2 tokens per sequence in steady decoding) takes the layout
    (runner.catchup_graphs); a prompt chunk longer than Q or a sequence without tokens does not."""
    layout = VerifyLayout(Q)
    catchup = dataclasses.replace(verify_step([1, 0, 3], [10, 20, 5]), num_drafts=None, draft_ids=None,
                                  logits_indices=np.array([1, 2, 6], dtype=np.int64))
    assert layout.holds(catchup) and not layout.fits(catchup)
    rows = layout.rows(catchup)
    np.testing.assert_array_equal(rows.row_of_token, [2, 3, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(rows.logits_rows, [3, 7, 11])      # each sequence's last row
    assert not layout.holds(dataclasses.replace(catchup, cu_seqlens_q=np.array([0, 5, 6, 7], dtype=np.int32)))
    assert not layout.holds(dataclasses.replace(catchup, cu_seqlens_q=np.array([0, 2, 2, 5], dtype=np.int32)))  # 0
    assert not layout.holds(dataclasses.replace(catchup, is_decode=True))
