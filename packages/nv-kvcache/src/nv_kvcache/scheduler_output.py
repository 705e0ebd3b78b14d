"""What one scheduling step hands to the model runner."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from nv_kvcache.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int     # tokens to compute this step, starting at seq.num_computed_tokens
                            # (the scheduler advances num_computed_tokens only in postprocess)
    samples: bool           # this chunk reaches the end of seq.token_ids: the step samples its next token

    @property
    def start(self) -> int:
        """Position of the first token computed this step (valid until postprocess)."""
        return self.seq.num_computed_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq]   # decodes first, then prefill chunks (running, then new), stable
    preempted: list[Sequence]       # sent back to waiting while scheduling this step
    num_batched_tokens: int
    num_draft_tokens: int = 0       # speculative decoding: draft tokens among them (the entries' seq.spec_token_ids)

    @cached_property
    def sampling(self) -> list[ScheduledSeq]:
        """Entries that sample a token this step, in order; postprocess's token ids align with it."""
        return [s for s in self.scheduled if s.samples]

    @cached_property
    def is_pure_decode(self) -> bool:
        """Every entry computes one token and samples (an empty step is not a decode)."""
        return bool(self.scheduled) and self.num_batched_tokens == len(self.scheduled) == len(self.sampling)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
