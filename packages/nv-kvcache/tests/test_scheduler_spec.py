"""Scheduler with draft tokens (speculative decoding): greedy verification against a copying fake model gives
exactly the outputs of a run without drafts, with preemption and prefix caching; drafts stop above the batch
threshold."""
from __future__ import annotations

from array import array

import pytest
import xxhash

from nv_kvcache import Scheduler, Sequence, StopRules
from nv_kvcache.scheduler_output import SchedulerOutput
from nv_kvcache.testing import check_invariants

PERIOD = 5


def next_token(tokens: list[int]) -> int:
    """Mostly copies the token PERIOD back (so prompt lookup drafts are often right); every few positions a
    hash of the history instead (so some drafts are rejected)."""
    h = xxhash.xxh64_intdigest(array("q", tokens).tobytes())
    if len(tokens) >= PERIOD and h % 4:
        return tokens[-PERIOD]
    return h % 50


def lookup(tokens: list[int], most: int) -> list[int]:
    """Propose the `most` tokens that followed the previous occurrence of the last token."""
    last = tokens[-1]
    for start in range(len(tokens) - 2, -1, -1):
        if tokens[start] == last:
            return tokens[start + 1:start + 1 + most][:3]
    return []


def verify(out: SchedulerOutput) -> list[list[int]]:
    """Greedy verification of each sampling entry's drafts: accepted prefix + the target's next token."""
    runs = []
    for entry in out.sampling:
        seq = entry.seq
        context = list(seq.token_ids)
        run = []
        for draft in [*seq.spec_token_ids, None]:
            target = next_token(context)
            run.append(target)
            if draft != target:
                break
            context.append(target)
        runs.append(run)
    return runs


def run(scheduler: Scheduler, prompts: list[list[int]], rules: StopRules, speculate: bool) -> list[list[int]]:
    seqs = [Sequence(p, rules) for p in prompts]
    for seq in seqs:
        scheduler.add(seq)
    for _ in range(10_000):
        if not scheduler.has_unfinished():
            return [s.output_token_ids for s in seqs]
        out = scheduler.schedule()
        if speculate:
            scheduler.postprocess_runs(out, verify(out))
        else:
            scheduler.postprocess(out, [next_token(e.seq.token_ids) for e in out.sampling])
        check_invariants(scheduler)
    raise AssertionError("not finished")


PROMPTS = [[(i * 7 + j) % 11 for j in range(3 + i)] for i in range(6)]


@pytest.mark.parametrize(("num_blocks", "caching"), [(64, False), (64, True), (14, True), (14, False)])
def test_speculative_outputs_equal_plain_outputs(num_blocks, caching):
    rules = StopRules(max_tokens=40, eos_token_ids=frozenset({49}))
    def make(**spec):
        return Scheduler(num_blocks=num_blocks, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                         max_model_len=128, enable_prefix_caching=caching, **spec)
    plain = run(make(), PROMPTS + PROMPTS[:2], rules, speculate=False)
    spec = make(propose=lookup, spec_max_batch_size=8)
    assert run(spec, PROMPTS + PROMPTS[:2], rules, speculate=True) == plain
    stats = spec.stats()
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens
    if num_blocks == 14:
        assert stats.num_preemptions > 0


def test_max_tokens_cuts_an_accepted_run():
    scheduler = Scheduler(num_blocks=16, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64,
                          propose=lambda tokens, most: [1, 2, 3][:most], spec_max_batch_size=2)
    seq = Sequence([1, 2, 3, 1], StopRules(max_tokens=3))
    scheduler.add(seq)
    scheduler.postprocess_runs(out := scheduler.schedule(), [[2]])     # the prefill: no drafts
    assert out.scheduled[0].num_new_tokens == 4 and not seq.spec_token_ids
    out = scheduler.schedule()
    assert seq.spec_token_ids == [1] and out.scheduled[0].num_new_tokens == 2    # capped: 2 outputs left
    assert scheduler.postprocess_runs(out, [[1, 7]]) == [seq]
    assert seq.output_token_ids == [2, 1, 7] and seq.finish_reason == "length"


def test_no_drafts_above_the_batch_threshold():
    scheduler = Scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                          max_model_len=64, propose=lambda tokens, most: [5][:most], spec_max_batch_size=2)
    seqs = [Sequence([1, 2, 3], StopRules(max_tokens=20)) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    scheduler.postprocess_runs(scheduler.schedule(), [[4]] * 3)
    out = scheduler.schedule()                     # 3 running > 2: plain decodes
    assert [e.num_new_tokens for e in out.scheduled] == [1, 1, 1] and out.is_pure_decode
    scheduler.finish(seqs[2].seq_id)
    scheduler.postprocess_runs(out, [[4]] * 3)
    out = scheduler.schedule()                     # 2 running: drafts again
    assert [e.num_new_tokens for e in out.scheduled] == [2, 2]
