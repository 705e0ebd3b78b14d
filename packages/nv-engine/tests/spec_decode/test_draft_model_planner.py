"""DraftModelPlanner: the draft model's forwards of a step (catch-up pieces, proposal decodes, where the drafts go
in the target's input) and what the draft has computed afterwards."""
from __future__ import annotations

import numpy as np

from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.core.step_builder import StepBuilder
from nv_engine.sampling_params import SamplingParams
from nv_engine.spec_decode.draft_model_planner import DraftModelPlanner
from nv_kvcache import Scheduler, StopRules

BS = 4


def sequence(prompt: list[int], seq_id: int) -> EngineSequence:
    return EngineSequence(prompt, StopRules(max_tokens=20), request_id=str(seq_id), index=0,
                          params=SamplingParams(), seed=0, reports_each_token=False)


def engine(k: int = 3, max_catchup_tokens: int = 64, spec_max_batch_size: int = 4):
    planner = DraftModelPlanner(k, BS, max_catchup_tokens)
    scheduler = Scheduler(num_blocks=32, block_size=BS, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          propose=planner.propose, spec_max_batch_size=spec_max_batch_size)
    return planner, scheduler, StepBuilder(BS, 16, planner)


def slots(seq: EngineSequence, positions: list[int]) -> list[int]:
    return [seq.block_table[p // BS] * BS + p % BS for p in positions]


def test_prefill_then_drafts_then_catch_up_after_all_accepted():
    planner, scheduler, builder = engine(k=3)
    a = sequence([1, 2, 3, 4, 5], 0)
    scheduler.add(a)
    out = scheduler.schedule()
    step = builder.build(out)
    draft = step.draft
    assert draft is not None and step.draft_ids is None
    assert [c.input_ids.tolist() for c in draft.catchup] == [[1, 2, 3, 4, 5]]     # the prompt, mirrored
    assert draft.catchup[0].logits_indices.tolist() == [] and draft.proposals == []
    assert a.draft_computed_tokens == 5
    scheduler.postprocess_runs(out, [[9]])

    out = scheduler.schedule()                                    # decode with 3 placeholder drafts
    step = builder.build(out)
    draft = step.draft
    assert draft is not None and step.input_ids.tolist() == [9, -1, -1, -1]
    (catchup,) = draft.catchup
    assert catchup.input_ids.tolist() == [9] and catchup.positions.tolist() == [5]
    assert catchup.slot_mapping.tolist() == slots(a, [5]) and catchup.logits_indices.tolist() == [0]
    assert [s.tolist() for s in draft.catchup_seqs] == [[0]]
    assert [p.positions.tolist() for p in draft.proposals] == [[6], [7]]    # drafts 1 and 2 in, 2 and 3 out
    assert [p.slot_mapping.tolist() for p in draft.proposals] == [slots(a, [6]), slots(a, [7])]
    assert [p.seq_lens.tolist() for p in draft.proposals] == [[7], [8]]
    assert draft.target_rows.tolist() == [1, 2, 3] and draft.draft_index.tolist() == [0, 1, 2]
    runs = [[11, 12, 13, 14]]                                     # every draft accepted, plus the bonus token
    planner.accepted(out, runs)
    scheduler.postprocess_runs(out, runs)
    assert a.num_computed_tokens == 9 and a.draft_computed_tokens == 8    # draft 3 was never an input

    step = builder.build(scheduler.schedule())
    assert step.draft is not None
    assert step.draft.catchup[0].input_ids.tolist() == [13, 14]           # draft 3 and the bonus token
    assert step.draft.catchup[0].positions.tolist() == [8, 9]


def test_rejection_keeps_the_accepted_drafts_kv():
    planner, scheduler, builder = engine(k=3)
    a = sequence([1, 2, 3, 4, 5], 0)
    scheduler.add(a)
    builder.build(out := scheduler.schedule())
    scheduler.postprocess_runs(out, [[9]])
    out = scheduler.schedule()
    builder.build(out)
    runs = [[11, 20]]                                             # draft 1 accepted, draft 2 rejected
    planner.accepted(out, runs)
    scheduler.postprocess_runs(out, runs)
    assert a.num_computed_tokens == 7 and a.draft_computed_tokens == 7


def test_catch_up_is_cut_into_pieces_and_only_the_last_predicts():
    planner, scheduler, builder = engine(k=2, max_catchup_tokens=3)
    a, b = sequence([1, 2, 3, 4, 5], 0), sequence([6, 7], 1)
    scheduler.add(a)
    scheduler.add(b)
    out = scheduler.schedule()
    draft = builder.build(out).draft
    assert draft is not None
    assert [c.input_ids.tolist() for c in draft.catchup] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [c.positions.tolist() for c in draft.catchup] == [[0, 1, 2], [3, 4, 0], [1]]
    assert [c.seq_lens.tolist() for c in draft.catchup] == [[3], [5, 1], [2]]
    assert (a.draft_computed_tokens, b.draft_computed_tokens) == (5, 2)
    scheduler.postprocess_runs(out, [[8], [9]])
    out = scheduler.schedule()
    step = builder.build(out)
    draft = step.draft
    assert draft is not None and [c.input_ids.tolist() for c in draft.catchup] == [[8, 9]]
    assert draft.catchup[0].logits_indices.tolist() == [0, 1] and draft.catchup_seqs[0].tolist() == [0, 1]
    assert draft.target_rows.tolist() == [1, 2, 4, 5] and draft.draft_index.tolist() == [0, 1, 2, 3]
    assert np.array_equal(draft.proposal_seqs[0], [0, 1])


def test_pure_decodes_without_drafts_skip_the_draft_and_preemption_resets_it():
    planner, scheduler, builder = engine(k=2, spec_max_batch_size=0)      # drafting off: pure decodes
    a = sequence([1, 2, 3], 0)
    scheduler.add(a)
    builder.build(out := scheduler.schedule())
    scheduler.postprocess_runs(out, [[4]])
    for token in (5, 6):
        out = scheduler.schedule()
        assert out.is_pure_decode and builder.build(out).draft is None
        scheduler.postprocess_runs(out, [[token]])
    assert a.num_computed_tokens == 5 and a.draft_computed_tokens == 3    # the draft lags two tokens
    scheduler.spec_max_batch_size = 4
    draft = builder.build(scheduler.schedule()).draft
    assert draft is not None and draft.catchup[0].input_ids.tolist() == [4, 5, 6]
    a.draft_computed_tokens = 50            # as if preempted: num_computed_tokens dropped below it
    scheduler.discard_pending()
    draft = builder.build(scheduler.schedule()).draft
    assert draft is not None and draft.catchup[0].positions.tolist() == [5]


def test_a_pipelined_step_leaves_the_placeholder_token_to_a_later_catch_up():
    """A step scheduled before the last step's ids are back (no drafts) with a new prompt beside a decode: the
    draft catches the decode up to its last real token only (a placeholder is no input); the next drafting step
    catches up the token that replaced it."""
    planner, scheduler, builder = engine(k=2, spec_max_batch_size=0)
    a = sequence([1, 2, 3], 0)
    scheduler.add(a)
    builder.build(out := scheduler.schedule())
    scheduler.postprocess_runs(out, [[4]])
    builder.build(decode := scheduler.schedule())                         # a pure decode: the draft lags
    scheduler.postprocess(decode, [-1])                                   # pipelined: token 5 not yet known
    scheduler.add(sequence([7, 8], 1))
    out = scheduler.schedule()
    assert not out.is_pure_decode
    draft = builder.build(out).draft
    assert draft is not None
    assert [c.input_ids.tolist() for c in draft.catchup] == [[4, 7, 8]]   # a's 4 (no placeholder), b's prompt
    assert a.draft_computed_tokens == 4
    scheduler.resolve_placeholders(decode, [5], -1)
    scheduler.postprocess_runs(out, [[6], [9]])
    scheduler.spec_max_batch_size = 4
    draft = builder.build(scheduler.schedule()).draft
    assert draft is not None
    assert [c.input_ids.tolist() for c in draft.catchup] == [[5, 6, 9]]
