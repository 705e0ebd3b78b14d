"""SpeculativeDecoding with an adaptive draft length: which steps are scheduled so that they may draft while
sequences have stopped drafting (the others pipeline)."""
from __future__ import annotations

from types import SimpleNamespace

from nv_engine.config.speculative_config import SpeculativeConfig
from nv_engine.spec_decode.draft_acceptance import DraftAcceptance
from nv_engine.spec_decode.speculative_decoding import PROBE_EVERY, SpeculativeDecoding


def sequence(num_tokens: int, resume_at: int, acceptance: float = 0.9, find_rate: float = 1.0) -> SimpleNamespace:
    """A running sequence's stand-in: resume_at -1 drafts (at this acceptance and find rate), >= 0 stopped until then
    (0 with no evidence: new)."""
    state = DraftAcceptance()
    if resume_at != 0:
        state.accepted, state.tested, state.resume_at = 0.0, 2.0, resume_at
    if resume_at == -1:
        state.accepted = 2.0 * acceptance
        state.asked, state.found = 4.0, 4.0 * find_rate
    return SimpleNamespace(token_ids=[1] * num_tokens, draft_acceptance=state)


class StubScheduler:
    """What SpeculativeDecoding.schedule touches: the running sequences and the drafting limit it sets."""

    def __init__(self, running: list[SimpleNamespace]) -> None:
        self.running = running
        self.spec_max_batch_size = -1

    def schedule(self) -> int:
        return self.spec_max_batch_size


def test_stopped_sequences_pipeline_and_due_probes_share_every_probe_every_th_step():
    spec = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3), block_size=16, max_num_batched_tokens=256)
    waiting = [sequence(50, 60), sequence(50, 90)]
    assert not any(spec.drafts_next(waiting, 0) for _ in range(3 * PROBE_EVERY))     # no probe due: pipelined
    due = [sequence(50, 40), sequence(50, 45), sequence(50, 90)]
    wanted = [spec.drafts_next(due, 0) for _ in range(3 * PROBE_EVERY)]
    assert sum(wanted) == 3 and all(wanted[i] == ((i + 1) % PROBE_EVERY == 0) for i in range(len(wanted)))
    drafting = [sequence(50, 90), sequence(50, -1)]
    assert spec.drafts_next(drafting, 0)                          # a drafting sequence: at once
    assert spec.drafts_next([sequence(50, 0)], 0)                 # a new one too


def test_fixed_length_drafts_whenever_allowed():
    spec = SpeculativeDecoding(SpeculativeConfig(adaptive_draft_length=False), block_size=16,
                               max_num_batched_tokens=256)
    assert spec.policy is None
    assert spec.drafts_next([sequence(50, 90)], 0)


def test_draft_model_adapts_with_its_own_costs_and_pipelines_only_when_adaptive():
    """A draft model's drafting step costs its forwards too: its policy stops at acceptances where ngram's still
    drafts; steps without drafts pipeline only where the policy can turn the draft off."""
    ngram = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3), block_size=16,
                                max_num_batched_tokens=256)
    draft = SpeculativeDecoding(SpeculativeConfig(model="draft", num_speculative_tokens=3), block_size=16,
                                max_num_batched_tokens=256)
    assert ngram.policy is not None and draft.policy is not None
    assert ngram.policy.best_length(0.6) == 3 and draft.policy.best_length(0.6) == 0
    assert draft.policy.best_length(0.9) == 3
    assert draft.pipelines
    fixed = SpeculativeDecoding(SpeculativeConfig(model="draft", adaptive_draft_length=False), block_size=16,
                                max_num_batched_tokens=256)
    assert fixed.policy is None and not fixed.pipelines


def test_a_batch_whose_drafting_does_not_pay_pipelines_with_doubling_refreshes():
    """Sequences that draft well when their lookup finds something, but find it in a third of the steps (random
    prompts at batch 8: measured 0.80-0.94x of plain before the batch rule): no step drafts but refresh steps,
    after 8, 16, 32, then every 64 steps; the refresh is scheduled with drafts, any other step without."""
    spec = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3), block_size=16, max_num_batched_tokens=256)
    batch = [sequence(50, -1, acceptance=0.77, find_rate=0.34) for _ in range(8)]
    scheduler = StubScheduler(batch)
    assert spec.schedule(scheduler, 0) == 0                      # after a drafting step: no more drafts
    wanted = [spec.drafts_next(batch, 0) for _ in range(250)]
    assert [i + 1 for i, w in enumerate(wanted) if w] == [8, 24, 56, 120, 184, 248]
    assert not any(spec.drafts_next(batch, 0) for _ in range(61))
    assert spec.drafts_next(batch, 0)                            # step 312: refresh granted ...
    assert spec.schedule(scheduler, 0) == spec.config.max_batch_size    # ... and scheduled with drafts
    assert spec.schedule(scheduler, 0) == 0                      # once


def test_a_batch_whose_drafting_pays_drafts_and_starts_refreshes_over():
    spec = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3), block_size=16, max_num_batched_tokens=256)
    poor = [sequence(50, -1, acceptance=0.77, find_rate=0.34) for _ in range(8)]
    for _ in range(30):
        spec.drafts_next(poor, 0)                                # waits now 32 steps for its next refresh
    good = [sequence(50, -1, acceptance=0.88, find_rate=0.8) for _ in range(8)]   # repetitive text
    scheduler = StubScheduler(good)
    assert spec.drafts_next(good, 0) and spec.schedule(scheduler, 0) == spec.config.max_batch_size
    assert [i + 1 for i, w in enumerate(spec.drafts_next(poor, 0) for _ in range(30)) if w] == [8, 24]
    # a sequence that drafts well (3.71 expected tokens a step) carries one neighbour that stopped drafting (the
    # step costs 2 x 2.15 plain steps' tokens), not three (4 x 2.04)
    good = sequence(50, -1, acceptance=0.95, find_rate=1.0)
    pair = [good, sequence(50, 900)]
    assert spec.drafts_next(pair, 0) is True and spec.schedule(StubScheduler(pair), 0) == spec.config.max_batch_size
    four = [good] + [sequence(50, 900) for _ in range(3)]
    assert not spec.drafts_next(four, 0) and spec.schedule(StubScheduler(four), 0) == 0


def test_batches_above_max_batch_size_skip_the_batch_rule():
    """More running sequences than max_batch_size draft nothing anyway (the scheduler's own limit): the batch rule is
    not evaluated for them, so a large batch's synchronous steps pay nothing per sequence for it."""
    spec = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3, max_batch_size=4), block_size=16,
                               max_num_batched_tokens=256)
    assert spec.adaptive is not None
    calls: list[int] = []
    spec.adaptive.step_may_draft = lambda running: calls.append(len(running)) or False   # type: ignore[method-assign]
    assert spec.schedule(StubScheduler([sequence(50, -1) for _ in range(6)]), 0) == 4 and calls == []
    assert spec.schedule(StubScheduler([sequence(50, -1) for _ in range(3)]), 0) == 0 and calls == [3]


def test_the_step_after_a_granted_drafts_next_is_not_weighed_again():
    """drafts_next weighs the batch once; the schedule right after it takes that answer. A schedule with no
    drafts_next before it (after a drafting step) weighs the batch itself."""
    spec = SpeculativeDecoding(SpeculativeConfig(num_speculative_tokens=3), block_size=16,
                               max_num_batched_tokens=256)
    assert spec.adaptive is not None
    policy = spec.adaptive.policy
    weighed: list[int] = []
    batch_pays = policy.batch_pays
    policy.batch_pays = lambda expected: weighed.append(1) or batch_pays(expected)   # type: ignore[method-assign]
    good = [sequence(50, -1, acceptance=0.88, find_rate=0.8) for _ in range(4)]
    assert spec.drafts_next(good, 0) and len(weighed) == 1
    assert spec.schedule(StubScheduler(good), 0) == spec.config.max_batch_size and len(weighed) == 1
    assert spec.schedule(StubScheduler(good), 0) == spec.config.max_batch_size and len(weighed) == 2
