"""Stop rules (max_tokens, EOS ids, stop ids, min_tokens, ignore_eos, max_model_len), finish and abort."""
import pytest

from nv_kvcache import FinishReason, Scheduler, Sequence, SequenceStatus, StopRules
from nv_kvcache.testing import check_invariants


def make(**kw) -> Scheduler:
    args = dict(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    args.update(kw)
    return Scheduler(**args)


def generate(sched: Scheduler, seq: Sequence, script: list[int]) -> Sequence:
    """Run seq alone, sampling the scripted tokens in order."""
    sched.add(seq)
    tokens = iter(script)
    while not seq.is_finished:
        out = sched.schedule()
        sched.postprocess(out, [next(tokens) for _ in out.sampling])
        check_invariants(sched)
    return seq


def test_max_tokens_gives_length():
    seq = generate(make(), Sequence([1, 2], StopRules(max_tokens=3)), [5, 6, 7, 8])
    assert seq.output_token_ids == [5, 6, 7] and seq.finish_reason is FinishReason.LENGTH
    assert seq.stop_token_id is None and seq.block_table == []


def test_any_of_several_eos_ids_stops():
    rules = StopRules(max_tokens=10, eos_token_ids={2, 3})
    seq = generate(make(), Sequence([1], rules), [5, 3, 9])
    assert seq.output_token_ids == [5, 3] and seq.finish_reason is FinishReason.STOP and seq.stop_token_id == 3
    seq = generate(make(), Sequence([1], rules), [2])
    assert seq.output_token_ids == [2] and seq.stop_token_id == 2


def test_min_tokens_ignores_eos_and_stop_ids_until_reached():
    rules = StopRules(max_tokens=10, min_tokens=3, eos_token_ids={2}, stop_token_ids={4})
    seq = generate(make(), Sequence([1], rules), [2, 4, 2, 9])
    assert seq.output_token_ids == [2, 4, 2] and seq.stop_token_id == 2
    seq = generate(make(), Sequence([1], rules), [2, 4, 5, 4])
    assert seq.output_token_ids == [2, 4, 5, 4] and seq.stop_token_id == 4


def test_ignore_eos_keeps_stop_token_ids():
    rules = StopRules(max_tokens=5, ignore_eos=True, eos_token_ids={2}, stop_token_ids={7})
    seq = generate(make(), Sequence([1], rules), [2, 2, 7, 3])
    assert seq.output_token_ids == [2, 2, 7] and seq.finish_reason is FinishReason.STOP
    seq = generate(make(), Sequence([1], rules), [2] * 5)
    assert seq.output_token_ids == [2] * 5 and seq.finish_reason is FinishReason.LENGTH


def test_stop_wins_over_length_on_the_same_token():
    seq = generate(make(), Sequence([1], StopRules(max_tokens=2, eos_token_ids={2})), [5, 2])
    assert seq.finish_reason is FinishReason.STOP and seq.stop_token_id == 2


def test_max_model_len_gives_length_not_a_crash():
    seq = generate(make(max_model_len=8), Sequence([1, 2, 3, 4, 5], StopRules(max_tokens=100)), [9] * 10)
    assert seq.num_tokens == 8 and seq.output_token_ids == [9, 9, 9] and seq.finish_reason is FinishReason.LENGTH
    # A prompt of exactly max_model_len tokens is computed and yields one token.
    seq = generate(make(max_model_len=8), Sequence(list(range(8)), StopRules(max_tokens=100)), [9])
    assert seq.output_token_ids == [9] and seq.finish_reason is FinishReason.LENGTH


def test_stop_rules_validate():
    assert StopRules(eos_token_ids=[1, 2]).eos_token_ids == frozenset({1, 2})
    assert StopRules(eos_token_ids={1}, stop_token_ids={5}, ignore_eos=True).stopping_ids == {5}
    with pytest.raises(ValueError, match="max_tokens"):
        StopRules(max_tokens=0)
    with pytest.raises(ValueError, match="min_tokens"):
        StopRules(max_tokens=2, min_tokens=3)
    with pytest.raises(TypeError):
        StopRules(eos_token_ids=2)
    with pytest.raises(TypeError):
        StopRules(stop_token_ids=["a"])
    with pytest.raises(TypeError):
        Sequence([1, "2"])
    with pytest.raises(ValueError, match=">= 0"):
        Sequence([1, -2])

    class IntLike:                        # e.g. a numpy integer
        def __index__(self):
            return 7
    assert Sequence([IntLike()]).token_ids == [7] and type(Sequence([IntLike()]).token_ids[0]) is int
    with pytest.raises(TypeError):
        Sequence([1], rules={"max_tokens": 3})


def test_sequence_fields():
    a, b = Sequence([3, 4]), Sequence([5], seq_id=10**9)
    assert a.seq_id != b.seq_id and b.seq_id == 10**9
    a.append_token(7)
    assert a.token_ids == [3, 4, 7] and a.output_token_ids == [7] and a.prompt_token_ids == [3, 4]
    assert (a.num_tokens, a.num_prompt_tokens, a.num_output_tokens, a.last_token_id) == (3, 2, 1, 7)
    assert a.status is SequenceStatus.WAITING and a.finish_reason is None and a.block_table == []


def started(sched: Scheduler, prompt_len: int, **rules) -> Sequence:
    seq = Sequence(list(range(prompt_len)), StopRules(max_tokens=20, **rules))
    sched.add(seq)
    return seq


@pytest.mark.parametrize("where", ["waiting", "running", "mid_prefill"])
def test_abort_frees_everything(where):
    sched = make(max_num_batched_tokens=8)
    seq = started(sched, 20)
    other = started(sched, 3)
    if where != "waiting":
        out = sched.schedule()                  # seq gets 8 of its 20 prompt tokens
        sched.postprocess(out, [1] * len(out.sampling))
    if where == "running":
        for _ in range(3):                      # finish its prefill and decode once
            out = sched.schedule()
            sched.postprocess(out, [1] * len(out.sampling))
        assert seq.num_output_tokens >= 1
    assert sched.abort(seq.seq_id) is seq
    assert seq.status is SequenceStatus.FINISHED and seq.finish_reason is FinishReason.ABORT
    assert seq.block_table == [] and sched.get(seq.seq_id) is None
    check_invariants(sched)
    assert sched.abort(seq.seq_id) is None and sched.abort(12345678) is None
    assert sched.abort(other.seq_id) is other
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 64


def test_abort_between_schedule_and_postprocess_drops_the_token():
    sched = make()
    a, b = started(sched, 3), started(sched, 3)
    out = sched.schedule()
    sched.abort(a.seq_id)
    finished = sched.postprocess(out, [11, 12])
    assert finished == [] and a.output_token_ids == [] and b.output_token_ids == [12]
    assert sched.num_running == 1
    check_invariants(sched)


def test_finish_by_engine_side_stop():
    sched = make()
    seq = started(sched, 3)
    out = sched.schedule()
    sched.postprocess(out, [5])
    assert sched.finish(seq.seq_id) is seq
    assert seq.finish_reason is FinishReason.STOP and seq.block_table == []
    assert sched.block_manager.num_free_blocks == 64 and sched.num_running == 0


PLACEHOLDER = -1


def generate_overlapped(sched: Scheduler, seqs: list[Sequence], scripts: list[list[int]]) -> list[Sequence]:
    """Run seqs as an engine with async scheduling does: postprocess each step with placeholders,
    schedule the next step, then resolve the placeholders with the scripted ids."""
    for seq in seqs:
        sched.add(seq)
    tokens = {seq.seq_id: iter(script) for seq, script in zip(seqs, scripts, strict=True)}
    stopped_late = []
    out = sched.schedule()
    while not out.is_empty:
        sched.postprocess(out, [PLACEHOLDER] * len(out.sampling))
        following = sched.schedule()
        real = [next(tokens[entry.seq.seq_id]) for entry in out.sampling]
        stopped_late += sched.resolve_placeholders(out, real, PLACEHOLDER)
        check_invariants(sched)
        out = following
    assert all(seq.is_finished and seq.block_table == [] for seq in stopped_late)
    return seqs


def test_resolved_placeholders_give_the_synchronous_outcome():
    cases = [(StopRules(max_tokens=10, eos_token_ids={2}), [5, 6, 2, 9, 9]),
             (StopRules(max_tokens=10, min_tokens=3, eos_token_ids={2}, stop_token_ids={4}), [2, 4, 5, 4, 9, 9]),
             (StopRules(max_tokens=3, eos_token_ids={2}), [5, 6, 2, 9]),          # stop id on the last token
             (StopRules(max_tokens=4, ignore_eos=True, eos_token_ids={2}), [2, 2, 2, 2, 9])]
    synchronous = [generate(make(), Sequence([1, 3], rules), script) for rules, script in cases]
    sched = make()
    overlapped = generate_overlapped(sched, [Sequence([1, 3], rules) for rules, _ in cases],
                                     [script for _, script in cases])
    for sync, late in zip(synchronous, overlapped, strict=True):
        assert late.output_token_ids == sync.output_token_ids and PLACEHOLDER not in late.token_ids
        assert (late.finish_reason, late.stop_token_id) == (sync.finish_reason, sync.stop_token_id)
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 64
    with pytest.raises(ValueError, match="sampled token ids"):
        sched.resolve_placeholders(sched.schedule(), [1], PLACEHOLDER)


def test_discarded_step_is_scheduled_again():
    sched = make()
    seq = Sequence([1, 2, 3, 4, 5], StopRules(max_tokens=2))
    sched.add(seq)
    first = sched.schedule()
    sched.discard_pending()                      # its run failed: nothing was computed
    again = sched.schedule()                     # no "schedule() called twice"
    assert [(e.seq, e.num_new_tokens) for e in again.scheduled] == [(e.seq, e.num_new_tokens) for e in first.scheduled]
    sched.postprocess(again, [7])
    assert seq.output_token_ids == [7] and seq.num_computed_tokens == 5
    sched.discard_pending()
    sched.abort(seq.seq_id)
    assert sched.block_manager.num_free_blocks == 64 and not sched.has_unfinished()
