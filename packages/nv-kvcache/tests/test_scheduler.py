"""Scheduler: chunked prefill under a budget, mixed batches, preemption, add() validation.
Modelled on vLLM's tests/v1/core/test_scheduler.py."""
import random

import pytest

from nv_kvcache import Scheduler, Sequence, SequenceStatus, StopRules
from nv_kvcache.testing import FakeModel, check_invariants, check_scheduled, reference_output, run_to_completion


def make(num_blocks=1000, block_size=16, max_num_seqs=64, max_num_batched_tokens=1024, max_model_len=4096,
         **kw) -> Scheduler:
    return Scheduler(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, **kw)


def step(sched: Scheduler, model: FakeModel):
    out = sched.schedule()
    check_scheduled(sched, out)
    finished = sched.postprocess(out, model.step(out))
    check_invariants(sched)
    return out, finished


def chunks(out) -> list[tuple[int, int]]:
    return [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled]


def test_chunk_sizes_under_budget():
    sched, model = make(), FakeModel()
    a, b, c = (Sequence([i] * 800, StopRules(max_tokens=50), seq_id=i) for i in range(3))
    for seq in (a, b, c):
        sched.add(seq)
    out, _ = step(sched, model)
    assert chunks(out) == [(0, 800), (1, 224)]
    assert [s.samples for s in out.scheduled] == [True, False]
    assert out.num_batched_tokens == 1024 and not out.is_pure_decode
    assert b.num_computed_tokens == 224 and b.num_output_tokens == 0
    out, _ = step(sched, model)
    assert chunks(out) == [(0, 1), (1, 576), (2, 447)]        # decode first, then prefills
    out, _ = step(sched, model)
    assert chunks(out) == [(0, 1), (1, 1), (2, 353)]
    out, _ = step(sched, model)
    assert chunks(out) == [(0, 1), (1, 1), (2, 1)] and out.is_pure_decode
    assert [s.seq for s in out.sampling] == [a, b, c]


def test_max_num_seqs_caps_running():
    sched, model = make(max_num_seqs=2), FakeModel()
    for _ in range(3):
        sched.add(Sequence([1, 2, 3], StopRules(max_tokens=5)))
    out, _ = step(sched, model)
    assert len(out.scheduled) == 2 and sched.num_running == 2 and sched.num_waiting == 1


def test_budget_limits_decodes_too():
    sched, model = make(max_num_batched_tokens=2), FakeModel()
    seqs = [Sequence([7], StopRules(max_tokens=10)) for _ in range(3)]
    for seq in seqs:
        sched.add(seq)
    out, _ = step(sched, model)
    assert [s.seq for s in out.scheduled] == seqs[:2]
    out, _ = step(sched, model)
    assert [s.seq for s in out.scheduled] == seqs[:2]         # oldest decodes use the whole budget


def test_preemption_newest_first_and_exact_completion():
    # 8 blocks of 4 tokens; each sequence grows to 8 + 12 = 20 tokens = 5 blocks: both cannot fit.
    sched, model = make(num_blocks=8, block_size=4, max_model_len=64), FakeModel()
    rules = StopRules(max_tokens=12)
    old, new = Sequence(list(range(8)), rules), Sequence(list(range(50, 58)), rules)
    sched.add(old)
    sched.add(new)
    preempted_at = None
    while sched.has_unfinished():
        out, _ = step(sched, model)
        if out.preempted and preempted_at is None:
            preempted_at = sched.num_steps
            assert out.preempted == [new]                     # the newest goes first
            assert new.status is SequenceStatus.WAITING and new.block_table == []
            assert new.num_computed_tokens == 0 and sched.waiting[0] is new
            assert all(s.seq is not new for s in out.scheduled)
    assert preempted_at is not None and new.num_preemptions >= 1 and old.num_preemptions == 0
    for seq in (old, new):
        assert (seq.output_token_ids, seq.finish_reason) == reference_output(seq.prompt_token_ids, model, rules)
    assert sched.block_manager.num_free_blocks == 8


def test_newest_preempts_itself_and_nobody_is_admitted_that_step():
    sched, model = make(num_blocks=4, block_size=2, max_model_len=64), FakeModel()
    a = Sequence([1, 2, 3], StopRules(max_tokens=5))           # up to 8 tokens = 4 blocks
    b = Sequence([4, 5, 6, 7], StopRules(max_tokens=4))
    sched.add(a)
    sched.add(b)
    step(sched, model)                                          # a: 2 blocks, b: 2 full blocks
    c = Sequence([9], StopRules(max_tokens=1))
    sched.add(c)
    out = sched.schedule()                                      # a fits in its block; b needs one
    assert out.preempted == [b] and chunks(out) == [(a.seq_id, 1)]
    assert list(sched.waiting) == [b, c]                        # b at the front, c not admitted
    sched.postprocess(out, FakeModel().step(out))
    run_to_completion(sched, model, check=True)
    assert b.num_output_tokens == 4


def test_preempted_sequence_hits_its_own_cached_prefix():
    sched, model = make(num_blocks=6, block_size=4, max_model_len=64), FakeModel()
    a = Sequence(list(range(12)), StopRules(max_tokens=8))      # 20 tokens: 5 blocks
    b = Sequence(list(range(100, 108)), StopRules(max_tokens=8))
    sched.add(a)
    sched.add(b)
    readmit_hits = []
    while sched.has_unfinished():
        out, _ = step(sched, model)
        readmit_hits += [s.seq.num_cached_tokens for s in out.scheduled
                         if s.seq is b and s.seq.num_preemptions and s.num_new_tokens > 1]
    assert b.num_preemptions >= 1 and readmit_hits and readmit_hits[0] > 0


def test_victim_already_scheduled_leaves_the_batch_and_returns_its_budget():
    sched, model = make(num_blocks=5, block_size=4, max_num_batched_tokens=6, max_model_len=64), FakeModel()
    dec = Sequence([1, 2], StopRules(max_tokens=10))
    pre = Sequence(list(range(10, 22)), StopRules(max_tokens=2))
    sched.add(dec)
    sched.add(pre)
    out, _ = step(sched, model)                                  # dec: 2 tokens, pre: 4 of 12
    assert chunks(out) == [(dec.seq_id, 2), (pre.seq_id, 4)]
    sched.running.reverse()                                       # make the prefilling seq the older one
    hog = Sequence([7] * 8, StopRules(max_tokens=1))
    assert sched.block_manager.allocate(hog, 8)                   # 2 blocks taken by an outsider
    out = sched.schedule()                     # dec decodes (1 token), then pre's 5 tokens need 2 blocks
    assert out.preempted == [dec] and chunks(out) == [(pre.seq_id, 5)] and out.num_batched_tokens == 5
    sched.postprocess(out, model.step(out))
    sched.block_manager.free(hog)
    run_to_completion(sched, model, check=True)
    assert sched.block_manager.num_free_blocks == 5


def test_prefix_cache_hits_across_requests_and_off_switch():
    for caching in (True, False):
        sched, model = make(block_size=4, enable_prefix_caching=caching), FakeModel()
        first = Sequence(list(range(10)), StopRules(max_tokens=3))
        sched.add(first)
        run_to_completion(sched, model)
        second = Sequence(list(range(10)) + [77], StopRules(max_tokens=3))
        sched.add(second)
        out, _ = step(sched, model)
        expected = 8 if caching else 0
        assert second.num_cached_tokens == expected and out.scheduled[0].num_new_tokens == 11 - expected
        run_to_completion(sched, model)
        assert second.output_token_ids == reference_output(second.prompt_token_ids, model, second.rules)[0]


def test_random_workload_completes_exactly_with_no_leaked_blocks():
    rng = random.Random(1)
    sched, model = make(num_blocks=40, block_size=4, max_num_seqs=6, max_num_batched_tokens=24,
                        max_model_len=80), FakeModel(vocab_size=50)
    prefix = [rng.randrange(49) for _ in range(12)]
    seqs = []
    for _ in range(30):
        prompt = prefix[:rng.randrange(13)] + [rng.randrange(49) for _ in range(rng.randrange(1, 30))]
        max_tokens = rng.randrange(1, 40)
        rules = StopRules(max_tokens=max_tokens, min_tokens=min(rng.randrange(3), max_tokens),
                          eos_token_ids=frozenset({49, 48}))
        seqs.append(Sequence(prompt, rules))
        sched.add(seqs[-1])
    run_to_completion(sched, model, check=True)
    assert sched.num_preemptions > 0 and sched.block_manager.hit_rate > 0
    assert sched.block_manager.num_free_blocks == 40
    for seq in seqs:
        assert seq.block_table == [] and seq.status is SequenceStatus.FINISHED
        assert (seq.output_token_ids, seq.finish_reason) == reference_output(seq.prompt_token_ids, model,
                                                                             seq.rules, 80)


def snapshot(sched: Scheduler) -> tuple:
    bm = sched.block_manager
    return ([s.seq_id for s in sched.waiting], [s.seq_id for s in sched.running], sorted(sched._seqs),
            bm.free_block_ids(), bm.num_query_tokens)


@pytest.mark.parametrize("prompt,rules,match", [
    ([], StopRules(), "empty"),
    (list(range(65)), StopRules(), "longer than max_model_len"),
    (list(range(40)), StopRules(max_tokens=30), "more than the whole cache"),
])
def test_add_rejects_bad_requests_and_leaves_state_untouched(prompt, rules, match):
    sched, model = make(num_blocks=12, block_size=4, max_model_len=64), FakeModel()
    sched.add(Sequence([1, 2, 3], StopRules(max_tokens=4)))
    step(sched, model)
    sched.add(Sequence([4, 5], StopRules(max_tokens=4)))
    before = snapshot(sched)
    with pytest.raises(ValueError, match=match):
        sched.add(Sequence(prompt, rules))
    assert snapshot(sched) == before
    check_invariants(sched)


def test_add_accepts_a_request_that_just_fits_and_rejects_duplicates():
    sched = make(num_blocks=16, block_size=4, max_model_len=64)
    seq = Sequence(list(range(40)), StopRules(max_tokens=24))    # 64 tokens = 16 blocks
    sched.add(seq)
    with pytest.raises(ValueError, match="already scheduled"):
        sched.add(seq)
    with pytest.raises(ValueError, match="already scheduled"):
        sched.add(Sequence([1], seq_id=seq.seq_id))
    with pytest.raises(TypeError):
        sched.add([1, 2, 3])
    assert sched.num_waiting == 1


@pytest.mark.parametrize("name", ["num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                  "max_model_len"])
def test_bad_construction_raises(name):
    kwargs = dict(num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32)
    kwargs[name] = 0
    with pytest.raises(ValueError, match=name):
        Scheduler(**kwargs)


def test_step_protocol_errors():
    sched, model = make(), FakeModel()
    sched.add(Sequence([1, 2, 3]))
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="postprocess"):
        sched.schedule()
    with pytest.raises(ValueError, match="sampled token ids"):
        sched.postprocess(out, [])
    sched.postprocess(out, model.step(out))
    with pytest.raises(ValueError, match="latest"):
        sched.postprocess(out, model.step(out))
    empty = make().schedule()
    assert empty.scheduled == [] and not empty.is_pure_decode and empty.num_batched_tokens == 0
    assert make().postprocess(empty, []) == []


@pytest.mark.parametrize("threshold", [0, 256])
def test_a_long_prompt_arriving_mid_stream_holds_no_decode_back(threshold):
    """Streams decoding when a 3,000-token prompt arrives: every step still decodes each of them (they are
    scheduled first), and the prompt gets at most one chunk per step: the step budget, or
    long_prefill_token_threshold when set; its chunks add up to the prompt and it then decodes too."""
    budget = 1024
    sched, model = make(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold), FakeModel()
    streams = [Sequence([i + 1] * 20, StopRules(max_tokens=200, ignore_eos=True), seq_id=i) for i in range(8)]
    for seq in streams:
        sched.add(seq)
    while any(s.num_output_tokens == 0 for s in streams):
        step(sched, model)                                       # every stream decoding
    long_prompt = Sequence([9] * 3000, StopRules(max_tokens=4, ignore_eos=True), seq_id=100)
    sched.add(long_prompt)
    chunk_limit = threshold or budget
    prefilled = 0
    while long_prompt.num_output_tokens == 0:
        before = {s.seq_id: s.num_output_tokens for s in streams}
        out, _ = step(sched, model)
        assert all(s.num_output_tokens == before[s.seq_id] + 1 for s in streams), "a stream skipped a step"
        long_chunks = [n for seq_id, n in chunks(out) if seq_id == 100]
        assert len(long_chunks) == 1 and long_chunks[0] <= min(chunk_limit, budget - len(streams))
        prefilled += long_chunks[0]
    assert prefilled == 3000
    assert max(n for _, n in chunks(out)) <= chunk_limit


def test_long_prefill_token_threshold_spreads_several_prompts_over_one_step():
    """With the threshold, two long prompts share a step's budget instead of the oldest taking all of it."""
    sched, model = make(max_num_batched_tokens=1024, long_prefill_token_threshold=300), FakeModel()
    for i in range(3):
        sched.add(Sequence([i + 1] * 800, StopRules(max_tokens=5), seq_id=i))
    out, _ = step(sched, model)
    assert chunks(out) == [(0, 300), (1, 300), (2, 300)]
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        make(long_prefill_token_threshold=-1)
