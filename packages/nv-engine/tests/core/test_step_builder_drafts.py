"""StepBuilder for a step that verifies draft tokens (speculative decoding)."""
from __future__ import annotations

import numpy as np

from nv_engine.core.step_builder import StepBuilder
from nv_kvcache import Scheduler, Sequence, StopRules


def test_drafts_are_inputs_and_every_verified_slot_has_a_logits_row():
    drafts = {0: [7, 8], 1: []}
    sched = Scheduler(num_blocks=32, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                      propose=lambda tokens, most: drafts[tokens[0]][:most], spec_max_batch_size=4)
    a, b = Sequence([0, 1, 2, 3, 4], StopRules(max_tokens=10)), Sequence([1, 5, 6], StopRules(max_tokens=10))
    sched.add(a)
    sched.add(b)
    builder = StepBuilder(4, 16)
    first = sched.schedule()
    assert first.num_draft_tokens == 0 and builder.build(first).draft_ids is None
    sched.postprocess_runs(first, [[9], [9]])
    out = sched.schedule()
    step = builder.build(out)
    assert out.num_draft_tokens == 2 and not out.is_pure_decode
    assert step.input_ids.tolist() == [9, 7, 8, 9]                 # a: its last token + 2 drafts; b: 1 token
    assert step.positions.tolist() == [5, 6, 7, 3]
    assert step.seq_lens.tolist() == [8, 4]
    assert step.num_drafts is not None and step.num_drafts.tolist() == [2, 0]
    assert step.draft_ids is not None and step.draft_ids.tolist() == [[7, 8], [0, 0]]
    # K = 2: three rows per sequence; b's single row padded
    assert step.logits_indices.tolist() == [0, 1, 2, 3, 3, 3]
    table = a.block_table
    assert step.slot_mapping[:3].tolist() == [table[p // 4] * 4 + p % 4 for p in (5, 6, 7)]
    assert np.array_equal(step.cu_seqlens_q, [0, 3, 4])
