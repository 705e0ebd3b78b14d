"""DraftProposals: the scheduler's side of speculative decoding: which steps draft, how many drafts each decode
proposes, and the cumulative draft / accepted counts (SchedulerStats)."""
from __future__ import annotations

from collections.abc import Callable

from nv_kvcache.sequence import Sequence


class DraftProposals:
    """propose(token_ids, most) -> at most `most` draft tokens; drafts only in steps with at most max_batch_size
    running sequences; draft_length(seq), where given, caps each sequence's drafts in a step (0: none)."""

    def __init__(self, propose: Callable[[list[int], int], list[int]] | None, max_batch_size: int,
                 draft_length: Callable[[Sequence], int] | None) -> None:
        self.propose = propose
        self.max_batch_size = max_batch_size
        self.draft_length = draft_length
        self.num_draft_tokens = 0                # cumulative, for stats()
        self.num_accepted_tokens = 0

    def drafting(self, num_running: int) -> bool:
        """Whether a step with num_running running sequences drafts."""
        return self.propose is not None and num_running <= self.max_batch_size

    def draft(self, seq: Sequence, budget: int) -> int:
        """Propose seq's drafts (seq.spec_token_ids); their count. They fit the budget after seq's own token, and
        the emitted run (accepted + 1) cannot pass the length limit, nor draft_length(seq) where given."""
        most = min(budget - 1, seq._length_limit - len(seq.token_ids) - 1)
        if most > 0 and self.draft_length is not None:
            most = min(most, self.draft_length(seq))
        drafts = self.propose(seq.token_ids, most) if most > 0 and self.propose is not None else []
        seq.spec_token_ids = drafts
        return len(drafts)

    def verified(self, num_drafts: int, accepted: int) -> None:
        """A sequence's num_drafts drafts were verified, `accepted` of them accepted."""
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += accepted
