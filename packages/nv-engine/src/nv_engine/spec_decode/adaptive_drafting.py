"""AdaptiveDrafting: a DraftLengthPolicy applied to the engine core's sequences (speculative decoding with
adaptive_draft_length). It gives the scheduler each sequence's draft length (`draft_length`), tells
SpeculativeDecoding whether the running sequences want a drafting step (`sequences_want_drafts`) and hands each
verified step's acceptance to the policy (`record`)."""
from __future__ import annotations

from collections.abc import Sequence as Seq

from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.spec_decode.draft_length_policy import DraftLengthPolicy
from nv_kvcache import SchedulerOutput, Sequence

PROBE_EVERY = 8    # every PROBE_EVERY-th step is scheduled from real tokens to try drafting again (quiet drafting);
                   # while the policy's probes alone are due, every PROBE_EVERY-th step carries them


class AdaptiveDrafting:
    def __init__(self, policy: DraftLengthPolicy) -> None:
        self.policy = policy
        self.probe_wait = 0        # steps since the last probing step, while only the policy's probes are due

    def draft_length(self, seq: Sequence) -> int:
        """The scheduler's `draft_length`: the most drafts seq proposes this step (the policy's choice)."""
        engine_seq: EngineSequence = seq   # type: ignore[assignment]  # the engine core schedules only these
        return self.policy.draft_length(engine_seq.draft_acceptance, len(seq.token_ids))

    def sequences_want_drafts(self, running: Seq[Sequence]) -> bool | None:
        """The policy's view of the running sequences: None where some sequence drafts (not stopped, or new: the
        quiet rule decides); else whether this step should carry the probes due, at every PROBE_EVERY-th step
        while some is due, False while none is."""
        policy = self.policy
        probe_due = False
        for seq in running:
            engine_seq: EngineSequence = seq   # type: ignore[assignment]  # the engine core schedules only these
            state = engine_seq.draft_acceptance
            if policy.drafting(state):
                return None
            probe_due = probe_due or policy.due(state, len(seq.token_ids))
        if not probe_due:
            return False
        self.probe_wait += 1
        return self.probe_wait % PROBE_EVERY == 0

    def record(self, out: SchedulerOutput, runs: list[list[int]]) -> None:
        """The policy hears each drafting sequence's drafted and accepted counts (before postprocess_runs clears
        seq.spec_token_ids)."""
        policy = self.policy
        for entry, run in zip(out.sampling, runs, strict=True):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the engine core schedules only these
            drafted = len(seq.spec_token_ids)
            if drafted:
                policy.record(seq.draft_acceptance, len(seq.token_ids), drafted, max(len(run) - 1, 0))
