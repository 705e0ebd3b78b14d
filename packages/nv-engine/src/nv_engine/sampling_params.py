"""SamplingParams: vLLM's per-request sampling settings, validated on construction."""
from __future__ import annotations

import copy
import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from nv_kvcache import StopRules

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Sampling settings of one request (vLLM semantics and defaults).

    `stop` and `stop_token_ids` become lists (empty when unset); temperature 0 is greedy; top_k 0
    or -1 is off; max_tokens None means up to max_model_len;
    logprobs None returns none, k >= 0 returns the chosen token's plus the top k per token.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self._check_ints()
        self._check_floats()
        self._check_stops()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    def _check_ints(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an int, got {getattr(self, name)!r}")
        for name in ("seed", "max_tokens", "logprobs"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise ValueError(f"{name} must be an int or None, got {value!r}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (off) or at least 1, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be at most max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}")

    def _check_floats(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")

    def _check_stops(self) -> None:
        stop = self.stop
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, Iterable) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
        if any(s == "" for s in stops):
            raise ValueError("stop must not contain an empty string")
        self.stop = stops  # vLLM normalises None / str to a list
        ids = self.stop_token_ids
        if ids is None:
            ids = []
        elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"stop_token_ids must be a list of ints, got {ids!r}")
        ids = list(ids)
        if not all(_is_int(i) and i >= 0 for i in ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {ids!r}")
        self.stop_token_ids = ids

    # --- derived views -------------------------------------------------------------------------
    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def sampling_type(self) -> SamplingType:
        if self.is_greedy:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def effective_top_k(self) -> int:
        """top_k with "off" (0 or -1) as 0."""
        return max(self.top_k, 0)

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def clone(self) -> SamplingParams:
        """A deep copy; the engine keeps one per request so later edits by the caller are not seen."""
        return copy.deepcopy(self)

    def stop_rules(self, eos_token_ids: Iterable[int], *, max_model_len: int | None = None,
                   prompt_len: int = 0) -> StopRules:
        """nv_kvcache.StopRules for one sequence. `eos_token_ids` are the model's (several from the
        generation config are fine). max_tokens None -> up to max_model_len (the scheduler also
        stops any sequence at max_model_len)."""
        max_tokens = self.max_tokens
        if max_tokens is None:
            if max_model_len is None:
                raise ValueError("max_tokens=None needs max_model_len to bound the output")
            max_tokens = max(1, max_model_len - prompt_len)
        return StopRules(max_tokens=max_tokens, min_tokens=min(self.min_tokens, max_tokens),
                         ignore_eos=self.ignore_eos, eos_token_ids=frozenset(eos_token_ids),
                         stop_token_ids=frozenset(self.stop_token_ids or ()))
