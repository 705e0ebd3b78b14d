"""AdaptiveDrafting: a DraftLengthPolicy applied to the engine core's sequences (speculative decoding with
adaptive_draft_length). It gives the scheduler each sequence's draft length (`draft_length`), tells
SpeculativeDecoding whether the running sequences want a drafting step (`sequences_want_drafts`: the policy's
per-sequence stops and probes, then its batch rule) and hands each verified step's acceptance to the policy
(`record`).

While the batch rule says drafting does not pay, steps pipeline, but the sequences' estimates would never change:
a refresh step drafts after REFRESH_MIN steps, then after twice as many each time the rule still says no, up to
REFRESH_MAX (so a batch that never pays loses about one synchronous step in REFRESH_MAX); a step that pays starts
the wait from REFRESH_MIN again."""
from __future__ import annotations

from collections.abc import Sequence as Seq

from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.spec_decode.draft_length_policy import DraftLengthPolicy
from nv_kvcache import SchedulerOutput, Sequence

PROBE_EVERY = 8    # every PROBE_EVERY-th step is scheduled from real tokens to try drafting again (quiet drafting);
                   # while the policy's probes alone are due, every PROBE_EVERY-th step carries them
REFRESH_MIN = 8    # steps a batch whose drafting does not pay waits before a refresh step drafts ...
REFRESH_MAX = 64   # ... doubling at each refresh that still does not pay, up to this


class AdaptiveDrafting:
    def __init__(self, policy: DraftLengthPolicy) -> None:
        self.policy = policy
        self.probe_wait = 0        # steps since the last probing step, while only the policy's probes are due
        self.refresh_wait = 0      # steps since the batch rule last said no, or since the last refresh
        self.refresh_every = REFRESH_MIN
        # sequences_want_drafts weighed the batch and let the next step draft (it pays, or a refresh is due):
        # step_may_draft takes that answer instead of weighing the same batch again
        self.granted = False

    def draft_length(self, seq: Sequence) -> int:
        """The scheduler's `draft_length`: the most drafts seq proposes this step (the policy's choice). The scheduler
        asks it once per decode of a drafting step, right before the proposer: a length above 0 counts as the
        sequence's chance to find drafts (the policy's find rate)."""
        engine_seq: EngineSequence = seq   # type: ignore[assignment]  # the engine core schedules only these
        state = engine_seq.draft_acceptance
        length = self.policy.draft_length(state, len(seq.token_ids))
        if length:
            self.policy.asked(state)
        return length

    def sequences_want_drafts(self, running: Seq[Sequence]) -> bool | None:
        """The policy's view of the running sequences. Where some sequence drafts (not stopped, or new): None (the
        quiet rule decides) if the batch rule says a drafting step pays, else whether this is a refresh step.
        Where none does: whether this step should carry the probes due, at every PROBE_EVERY-th step while some
        is due, False while none is."""
        policy = self.policy
        self.granted = False
        probe_due = False
        for seq in running:
            engine_seq: EngineSequence = seq   # type: ignore[assignment]  # the engine core schedules only these
            state = engine_seq.draft_acceptance
            if policy.drafting(state):
                return self._batch_wants_drafts(running)
            probe_due = probe_due or policy.due(state, len(seq.token_ids))
        if not probe_due:
            return False
        self.probe_wait += 1
        return self.probe_wait % PROBE_EVERY == 0

    def _batch_wants_drafts(self, running: Seq[Sequence]) -> bool | None:
        """None where the policy's batch rule says a drafting step pays for `running`; else True at a refresh
        step (the module docstring's waits), False otherwise."""
        policy = self.policy
        if policy.batch_pays(policy.expected_step(seq.draft_acceptance)   # type: ignore[attr-defined]
                             for seq in running):
            self.refresh_wait = 0
            self.refresh_every = REFRESH_MIN
            self.granted = True
            return None
        self.refresh_wait += 1
        if self.refresh_wait < self.refresh_every:
            return False
        self.refresh_wait = 0
        self.refresh_every = min(2 * self.refresh_every, REFRESH_MAX)
        self.granted = True
        return True

    def step_may_draft(self, running: Seq[Sequence]) -> bool:
        """Whether the step about to be scheduled from real tokens may draft: yes where sequences_want_drafts just
        granted it (the batch pays, or a refresh); else unless some sequence drafts and the batch rule says drafting
        does not pay (so a step after a drafting step pipelines again once the batch stops paying; stopped
        sequences' due probes still go out where no sequence drafts)."""
        if self.granted:
            self.granted = False
            return True
        policy = self.policy
        states = [seq.draft_acceptance for seq in running]   # type: ignore[attr-defined]  # EngineSequences
        if not any(policy.drafting(state) for state in states):
            return True
        return policy.batch_pays(policy.expected_step(state) for state in states)

    def record(self, out: SchedulerOutput, runs: list[list[int]]) -> None:
        """The policy hears each drafting sequence's drafted and accepted counts (before postprocess_runs clears
        seq.spec_token_ids)."""
        policy = self.policy
        for entry, run in zip(out.sampling, runs, strict=True):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the engine core schedules only these
            drafted = len(seq.spec_token_ids)
            if drafted:
                policy.record(seq.draft_acceptance, len(seq.token_ids), drafted, max(len(run) - 1, 0))
