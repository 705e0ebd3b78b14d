"""DraftLengthPolicy: each sequence's draft length from its recent acceptance; stops, probes and backoff."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from nv_engine.spec_decode.draft_acceptance import DraftAcceptance
from nv_engine.spec_decode.draft_length_policy import FORGIVE_STREAK, LEVELS, DraftLengthPolicy


def drafting_steps(policy: DraftLengthPolicy, state: DraftAcceptance, start: int, num_tokens: int,
                   accepted_of: Callable[[int], int]) -> list[int]:
    """Generate num_tokens tokens one step at a time from position start; returns the positions of the steps that
    drafted. accepted_of(drafted) -> accepted drafts of such a step (the run is accepted + 1 tokens)."""
    position, drafted_at = start, []
    while position < start + num_tokens:
        k = policy.draft_length(state, position)
        assert 0 <= k <= policy.num_speculative_tokens
        if k == 0:
            position += 1
            continue
        drafted_at.append(position)
        accepted = accepted_of(k)
        policy.record(state, position, k, accepted)
        position += accepted + 1
    return drafted_at


def test_rejected_drafts_stop_then_probe_with_a_doubling_backoff():
    policy = DraftLengthPolicy(3)
    state = DraftAcceptance()
    assert policy.draft_length(state, 40) == 3                 # a new sequence drafts in full
    drafted_at = drafting_steps(policy, state, 40, 600, lambda k: 0)
    # stopped after its first step; probes after 8, 16, 32, 64, then every 128 tokens
    assert drafted_at == [40, 48, 64, 96, 160, 288, 416, 544]
    assert not policy.due(state, 545) and policy.draft_length(state, 671) == 0
    assert policy.due(state, 672) and policy.draft_length(state, 672) == 3


def test_always_accepted_drafts_keep_the_full_length():
    for k in (3, 5, 7):
        policy = DraftLengthPolicy(k)
        state = DraftAcceptance()
        position = 10
        for _ in range(200):
            assert policy.draft_length(state, position) == k
            policy.record(state, position, k, k)
            position += k + 1


def test_drafts_that_start_failing_stop_within_a_few_steps_and_probe_again():
    policy = DraftLengthPolicy(3)
    state = DraftAcceptance()
    drafting_steps(policy, state, 10, 400, lambda k: k)
    failing = drafting_steps(policy, state, 1000, 40, lambda k: 0)
    assert len([p for p in failing if p < 1000 + 8]) <= 6       # the steps before it stopped
    assert len(failing) < 10
    # the text turns repetitive again: the next probe drafts, is accepted, and drafting goes on in full
    resumed = drafting_steps(policy, state, 1100, 200, lambda k: k)
    assert resumed[0] < 1100 + 32 and len(resumed) >= 160 // 4


def test_a_recovered_sequence_backs_off_briefly_again():
    """After FORGIVE_STREAK drafting steps in a row the backoff starts again from min_backoff."""
    policy = DraftLengthPolicy(3)
    state = DraftAcceptance()
    drafting_steps(policy, state, 10, 600, lambda k: 0)
    assert state.backoff == policy.max_backoff
    position = state.resume_at                                   # the probe, then drafts accepted in full
    for _ in range(FORGIVE_STREAK):
        assert policy.draft_length(state, position) == 3
        policy.record(state, position, 3, 3)
        position += 4
    while state.resume_at < 0:                                   # then all rejected until it stops
        policy.record(state, position, 3, 0)
        position += 1
    assert state.resume_at == position - 1 + policy.min_backoff


def test_half_accepted_drafts_stop_at_batch_one_costs():
    """a = 0.5 per token: E(3) = 1.875 tokens per step, below a verify step's cost of about 2 plain steps."""
    policy = DraftLengthPolicy(3)
    state = DraftAcceptance()
    pattern = iter([1, 0] * 1000)                                # accepted 1, tested 2 per pair of steps
    drafted_at = drafting_steps(policy, state, 10, 500, lambda k: next(pattern))
    assert len(drafted_at) < 20


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_lengths_are_the_throughput_argmax_within_bounds(k):
    policy = DraftLengthPolicy(k, verify_cost=1.3, draft_token_cost=0.25)
    lengths = policy.lengths
    assert len(lengths) == LEVELS + 1 and lengths[0] == 0 and lengths[-1] == k
    assert all(0 <= n <= k for n in lengths) and lengths == sorted(lengths)
    for i, n in enumerate(lengths):
        a = i / LEVELS
        rates = [1.0] + [sum(a ** j for j in range(m + 1)) / (1.3 + 0.25 * m) for m in range(1, k + 1)]
        assert rates[n] == pytest.approx(max(rates))
    if k == 7:
        assert any(0 < n < k for n in lengths)                   # costly draft tokens: partial lengths pay


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_speculative_tokens >= 1"):
        DraftLengthPolicy(0)
    with pytest.raises(ValueError, match="verify_cost >= 1"):
        DraftLengthPolicy(3, verify_cost=0.5)
    with pytest.raises(ValueError, match="0 <= decay < 1"):
        DraftLengthPolicy(3, decay=1.0)
    with pytest.raises(ValueError, match="min_backoff <= max_backoff"):
        DraftLengthPolicy(3, min_backoff=16, max_backoff=8)


def test_find_rate_counts_the_steps_that_asked_for_drafts():
    policy = DraftLengthPolicy(3)
    state = DraftAcceptance()
    assert policy.expected_step(state) == pytest.approx(((1 - 0.8 ** 4) / 0.2, 3.0))   # new: prior, K drafts
    for found in (True, False, False, True, False, False):       # the lookup finds drafts in a third of the steps
        policy.asked(state)
        if found:
            policy.record(state, 10, 3, 3)
    assert 0.0 < state.found < state.asked
    tokens, drafts = policy.expected_step(state)
    find_rate = state.found / state.asked
    assert drafts == pytest.approx(3 * find_rate) and 1.0 < tokens < 1.0 + 3 * find_rate + 1e-9


def test_batch_rule_weighs_expected_tokens_against_the_shared_step():
    policy = DraftLengthPolicy(3)                                # verify_cost 2.0, draft_token_cost 0.05

    def expected(acceptance: float, find_rate: float) -> tuple[float, float]:
        state = DraftAcceptance()
        state.accepted, state.tested, state.resume_at = 10.0 * acceptance, 10.0, -1
        state.asked, state.found = 10.0, 10.0 * find_rate
        return policy.expected_step(state)

    # random prompts at batch 8 (one H100, before the rule): acceptance 0.77, a third of the asks found drafts
    assert not policy.batch_pays([expected(0.77, 0.34)] * 8)
    # the same sequences finding drafts every time would pay: E(3) = 2.83 tokens against C = 2.15
    assert policy.batch_pays([expected(0.77, 1.0)] * 8)
    # repetitive prompts: acceptance 0.88, four in five asks found drafts
    assert policy.batch_pays([expected(0.88, 0.8)] * 8) and policy.batch_pays([expected(0.88, 0.8)])
    stopped = DraftAcceptance()
    stopped.accepted, stopped.tested, stopped.resume_at = 0.0, 2.0, 500
    assert policy.expected_step(stopped) == (1.0, 0.0)
    assert not policy.batch_pays([policy.expected_step(stopped)] * 4)
    assert policy.batch_pays([policy.expected_step(DraftAcceptance())])     # a new sequence probes at once
