"""A request's token state as the scheduler and the block manager see it (no torch)."""
from __future__ import annotations

import enum
import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"        # an EOS id or a stop id (or an engine-side stop string)
    LENGTH = "length"    # max_tokens or max_model_len
    ABORT = "abort"


def _as_id_set(value: Iterable[int], name: str) -> frozenset[int]:
    if isinstance(value, int) or not isinstance(value, Iterable):
        raise TypeError(f"StopRules.{name} must be an iterable of ints, got {value!r}")
    ids = frozenset(value)
    for token_id in ids:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise TypeError(f"StopRules.{name} must hold ints, got {token_id!r}")
    return ids


@dataclass(frozen=True)
class StopRules:
    """When a sequence stops, judged on token ids (stop strings are the engine's job)."""

    max_tokens: int = 16            # output tokens
    min_tokens: int = 0             # EOS / stop ids ignored before this many output tokens
    ignore_eos: bool = False
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for name in ("max_tokens", "min_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"StopRules.{name} must be an int, got {value!r}")
        if self.max_tokens < 1:
            raise ValueError(f"StopRules.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"StopRules.min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        # Accept any iterable of ints (list, set, tuple) and store a frozenset.
        object.__setattr__(self, "eos_token_ids", _as_id_set(self.eos_token_ids, "eos_token_ids"))
        object.__setattr__(self, "stop_token_ids", _as_id_set(self.stop_token_ids, "stop_token_ids"))

    @property
    def stopping_ids(self) -> frozenset[int]:
        """Ids that finish the sequence with STOP (once min_tokens outputs exist)."""
        if self.ignore_eos:
            return self.stop_token_ids
        return self.eos_token_ids | self.stop_token_ids


_next_seq_id = itertools.count()


class Sequence:
    """Prompt + output token ids, status, computed-token count and block table of one request.

    Invariants kept by the Scheduler / BlockManager:
    - token_ids == prompt_token_ids + output_token_ids (one list, appended in place);
    - num_computed_tokens <= num_tokens and the block table covers at least num_computed_tokens;
    - a WAITING or FINISHED sequence has an empty block table and num_computed_tokens == 0
      (a FINISHED one keeps num_computed_tokens as it was, but holds no blocks).
    """

    __slots__ = (
        "seq_id", "prompt_token_ids", "output_token_ids", "token_ids", "status", "finish_reason",
        "stop_token_id", "num_computed_tokens", "num_cached_tokens", "block_table", "rules",
        "num_preemptions", "skip_prefix_cache", "spec_token_ids",
        # private, owned by the block manager / scheduler
        "_block_hashes", "_num_hashed_blocks", "_stop_ids", "_decode_entry", "_length_limit",
    )

    def __init__(self, prompt_token_ids: Iterable[int], rules: StopRules | None = None, *,
                 seq_id: int | None = None) -> None:
        if rules is None:
            rules = StopRules()
        elif not isinstance(rules, StopRules):
            raise TypeError(f"rules must be a StopRules, got {type(rules).__name__}")
        if seq_id is None:
            seq_id = next(_next_seq_id)
        elif not isinstance(seq_id, int) or isinstance(seq_id, bool):
            raise TypeError(f"seq_id must be an int, got {seq_id!r}")
        try:     # operator.index: ints and int-like scalars (numpy) only, stored as Python ints
            prompt = [operator.index(token_id) for token_id in prompt_token_ids]
        except TypeError as e:
            raise TypeError(f"prompt token ids must be ints: {e}") from None
        if prompt and min(prompt) < 0:
            raise ValueError(f"prompt token ids must be >= 0, got {min(prompt)}")
        self.seq_id = seq_id
        self.prompt_token_ids: list[int] = prompt
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(prompt)    # prompt + output, kept in sync by append_token
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_token_id: int | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.rules = rules
        self.num_preemptions = 0
        # True: never admitted onto cached prefix blocks, so every prompt position is computed (a
        # request that wants the prompt's logprobs); its own blocks are still cached for others.
        self.skip_prefix_cache = False
        # speculative decoding: the draft tokens scheduled after token_ids in the current step (verified with
        # it; not part of token_ids); empty outside a step that drafts for this sequence
        self.spec_token_ids: list[int] = []
        self._block_hashes: list[int] = []   # chained hashes of full blocks of token_ids, a prefix
        self._num_hashed_blocks = 0          # leading blocks of block_table registered in the cache
        self._stop_ids = rules.stopping_ids
        self._decode_entry = None            # cached ScheduledSeq(self, 1, True)
        # tokens (prompt + output) at which it finishes by LENGTH: max_tokens outputs or max_model_len,
        # set by the scheduler that takes it
        self._length_limit = len(prompt) + rules.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish_reason_after(self, token_id: int) -> FinishReason | None:
        """Why the sequence ends now that token_id was appended (a stop token, its length limit), else None."""
        if token_id in self._stop_ids and self.stopped_by_token():
            return FinishReason.STOP
        return FinishReason.LENGTH if len(self.token_ids) >= self._length_limit else None

    def stopped_by_token(self) -> bool:
        """Whether the last token is an EOS / stop id that ends the sequence (once min_tokens
        output tokens exist); records it as stop_token_id. The one place this rule is written."""
        token_id = self.token_ids[-1]
        if token_id in self._stop_ids and len(self.output_token_ids) >= self.rules.min_tokens:
            self.stop_token_id = token_id
            return True
        return False

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")
