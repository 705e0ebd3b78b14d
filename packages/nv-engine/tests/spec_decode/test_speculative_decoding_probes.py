"""SpeculativeDecoding with an adaptive draft length: which steps are scheduled so that they may draft while
sequences have stopped drafting (the others pipeline)."""
from __future__ import annotations

from types import SimpleNamespace

from nv_engine.config.speculative_config import SpeculativeConfig
from nv_engine.spec_decode.draft_acceptance import DraftAcceptance
from nv_engine.spec_decode.speculative_decoding import PROBE_EVERY, SpeculativeDecoding


def sequence(num_tokens: int, resume_at: int) -> SimpleNamespace:
    """A running sequence's stand-in: resume_at -1 drafts, >= 0 stopped until then (0 with no evidence: new)."""
    state = DraftAcceptance()
    if resume_at != 0:
        state.accepted, state.tested, state.resume_at = 0.0, 2.0, resume_at
    return SimpleNamespace(token_ids=[1] * num_tokens, draft_acceptance=state)


def test_stopped_sequences_pipeline_and_due_probes_share_every_probe_every_th_step():
    spec = SpeculativeDecoding(SpeculativeConfig(), block_size=16, max_num_batched_tokens=256)
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
    ngram = SpeculativeDecoding(SpeculativeConfig(), block_size=16, max_num_batched_tokens=256)
    draft = SpeculativeDecoding(SpeculativeConfig(model="draft"), block_size=16, max_num_batched_tokens=256)
    assert ngram.policy is not None and draft.policy is not None
    assert ngram.policy.best_length(0.6) == 3 and draft.policy.best_length(0.6) == 0
    assert draft.policy.best_length(0.9) == 3
    assert draft.pipelines
    fixed = SpeculativeDecoding(SpeculativeConfig(model="draft", adaptive_draft_length=False), block_size=16,
                                max_num_batched_tokens=256)
    assert fixed.policy is None and not fixed.pipelines
