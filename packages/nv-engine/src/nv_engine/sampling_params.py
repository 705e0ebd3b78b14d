"""SamplingParams: vLLM's per-request sampling settings, validated on construction."""
from __future__ import annotations

import copy
import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nv_engine.structured_output.params import StructuredOutputsParams
from nv_kvcache import StopRules

__all__ = ["RequestOutputKind", "SamplingParams", "SamplingType", "StructuredOutputsParams"]

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0   # OpenAI's bound on |bias|


class Tokenizer(Protocol):
    """What bad_words needs from a tokenizer (a transformers tokenizer fits)."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.IntEnum):
    """What each of a request's RequestOutputs carries (vLLM's names). CUMULATIVE: the text, token
    ids and logprobs so far. DELTA: only those new since the request's previous output (concatenated
    they make the CUMULATIVE ones; prompt logprobs come once), at a cost per output that does not
    grow with the output's length."""

    CUMULATIVE = 0
    DELTA = 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Sampling settings of one request (vLLM semantics and defaults).

    `stop` and `stop_token_ids` become lists (empty when unset); temperature 0 is greedy; top_k 0
    or -1 is off; max_tokens None means up to max_model_len;
    logprobs None returns none, k >= 0 returns the chosen token's plus the top k per token;
    prompt_logprobs k >= 0 returns, for each prompt token after the first, its logprob given the
    tokens before it plus the top k (such a request computes its whole prompt: no prefix-cache hits).
    logit_bias {token id: bias in [-100, 100]} is added to the logits before sampling (greedy
    included); allowed_token_ids limits sampling to those ids; bad_words are strings whose token
    sequences never complete (the last token is banned when the output ends with the others).
    structured_outputs constrains the output to a JSON schema, regex, choice or grammar
    (StructuredOutputsParams; a dict of its fields is taken too).
    output_kind: RequestOutputKind.CUMULATIVE (every output has everything so far) or DELTA.
    Token ids are checked against the model, and bad_words tokenized, by `prepare_for_model`.
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
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # bad_words as token sequences, set by prepare_for_model
    bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._check_ints()
        self._check_floats()
        self._check_stops()
        self._check_token_constraints()
        self._check_structured_outputs()
        if not isinstance(self.output_kind, RequestOutputKind):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except ValueError:
                raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}") from None
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")

    def _check_ints(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an int, got {getattr(self, name)!r}")
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
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

    def _check_token_constraints(self) -> None:
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}")
            checked: dict[int, float] = {}
            for token, value in bias.items():
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias keys must be non-negative token ids, got {token!r}")
                if not _is_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                    raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} "
                                     f"for token {token}")
                checked[token] = float(value)
            self.logit_bias = checked or None
        allowed = self.allowed_token_ids
        if allowed is not None:
            if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Iterable):
                raise ValueError(f"allowed_token_ids must be a list of ints, got {allowed!r}")
            allowed = list(allowed)
            if not allowed:
                raise ValueError("allowed_token_ids must not be empty")
            if not all(_is_int(i) and i >= 0 for i in allowed):
                raise ValueError(f"allowed_token_ids must be non-negative ints, got {allowed!r}")
            self.allowed_token_ids = allowed
        words = self.bad_words
        if words is not None:
            if isinstance(words, str) or not isinstance(words, Iterable):
                raise ValueError(f"bad_words must be a list of strings, got {words!r}")
            words = list(words)
            if not all(isinstance(w, str) and w.strip() for w in words):
                raise ValueError(f"bad_words must be non-empty strings, got {words!r}")
            self.bad_words = words or None

    def _check_structured_outputs(self) -> None:
        value = self.structured_outputs
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(StructuredOutputsParams.__dataclass_fields__))
            if unknown:
                raise ValueError(f"structured_outputs has unknown fields {unknown}")
            self.structured_outputs = StructuredOutputsParams(**value)
        elif value is not None and not isinstance(value, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got {value!r}")

    def prepare_for_model(self, vocab_size: int, tokenizer: Tokenizer | None) -> None:
        """Check token ids against the model's vocabulary and tokenize bad_words (ValueError naming
        the field otherwise). The engine calls it on its own copy when the request is added."""
        for name, ids in (("logit_bias", self.logit_bias or {}),
                          ("allowed_token_ids", self.allowed_token_ids or ())):
            out_of_range = sorted(i for i in ids if i >= vocab_size)
            if out_of_range:
                raise ValueError(f"{name} has token ids outside the vocabulary (size {vocab_size}): "
                                 f"{out_of_range[:8]}")
        self.bad_words_token_ids = []
        if not self.bad_words:
            return
        if tokenizer is None:
            raise ValueError("bad_words needs a tokenizer; this model has none")
        # As vLLM: each word alone and after a space (mid-text form), the latter kept only when it
        # tokenizes to as many tokens as the former with a different first token.
        for word in self.bad_words:
            alone = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
            spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            for ids in (alone, spaced):
                if ids and ids not in self.bad_words_token_ids and (
                        ids is alone or (len(ids) == len(alone) and ids[0] != alone[0])):
                    if any(not 0 <= i < vocab_size for i in ids):
                        raise ValueError(f"bad_words: {word!r} tokenizes outside the vocabulary")
                    self.bad_words_token_ids.append(ids)

    def banned_by_bad_words(self, output_token_ids: Sequence[int]) -> list[int]:
        """Tokens bad_words forbid next: the last token of each bad sequence whose other tokens
        end the output (single-token words always)."""
        banned = []
        for ids in self.bad_words_token_ids:
            prefix = ids[:-1]
            if not prefix or (len(output_token_ids) >= len(prefix)
                              and list(output_token_ids[len(output_token_ids) - len(prefix):]) == prefix):
                banned.append(ids[-1])
        return banned

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

    @property
    def needs_output_token_ids(self) -> bool:
        """The sampler reads the output so far (penalties, bad words): no step may run ahead (these
        requests turn async scheduling off while they run). A grammar's bitmask needs it too, but
        the engine fills that while the forward runs (ModelRunner.sample), so it keeps async."""
        return self.has_penalties or bool(self.bad_words)

    def needs_every_token(self, *, stream: bool, detokenizes: bool) -> bool:
        """Whether the engine core reports this request's tokens after every step (else once, when
        it finishes): when streamed, when it asks for logprobs, or when stop strings are checked
        (`detokenizes`: the frontend has a tokenizer). Both the core and the frontend use this rule."""
        return stream or self.logprobs is not None or (bool(self.stop) and detokenizes)

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
