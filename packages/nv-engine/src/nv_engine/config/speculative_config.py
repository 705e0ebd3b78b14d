"""SpeculativeConfig: speculative decoding's settings (vLLM's speculative_config / --speculative-config)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

SUPPORTED_METHODS = ("ngram",)
# vLLM's other methods: named so their error says "not supported yet" rather than "unknown"
NOT_YET_SUPPORTED_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """method "ngram" (prompt lookup): the last n tokens of a sequence (n from prompt_lookup_max down to
    prompt_lookup_min) are looked up earlier in its own tokens, and the num_speculative_tokens tokens that
    followed are proposed; the target model verifies them all in one forward.

    max_batch_size: a step with more running sequences than this runs without drafts. Speculation trades
    extra verified tokens (wasted when rejected) for fewer steps; that pays while a decode step is bound by
    reading the weights, i.e. at small batch. 32 is the default because a 0.6B-class model's decode step
    stays near its weight-read floor up to a few tens of sequences and, past that, rejected draft tokens
    cost real compute; measure the crossover per model and GPU (benchmarks/bench_spec_decode.py)."""

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    max_batch_size: int = 32

    def __post_init__(self) -> None:
        if self.method in NOT_YET_SUPPORTED_METHODS:
            raise ValueError(f"speculative_config.method {self.method!r} is not supported yet; "
                             f"supported: {list(SUPPORTED_METHODS)}")
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(SUPPORTED_METHODS)}, "
                             f"got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "max_batch_size"):
            _positive(name, getattr(self, name))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")

    @classmethod
    def from_value(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """The engine argument as given: a SpeculativeConfig, a dict or its JSON text, or None (off).
        ValueError naming the problem for bad JSON, an unknown key or a bad value."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict or a JSON object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; accepted: {sorted(known)}")
        return cls(**value)
