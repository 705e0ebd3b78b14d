"""SpeculativeConfig: speculative decoding's settings (vLLM's speculative_config / --speculative-config)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

SUPPORTED_METHODS = ("ngram", "draft_model")
# vLLM's other methods: named so their error says "not supported yet" rather than "unknown"
NOT_YET_SUPPORTED_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator")
DRAFT_SAMPLING = ("greedy", "sampled")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """method "ngram" (prompt lookup): the last n tokens of a sequence (n from prompt_lookup_max down to
    prompt_lookup_min) are looked up earlier in its own tokens, and the num_speculative_tokens tokens that
    followed are proposed; the target model verifies them all in one forward.

    method "draft_model" (vLLM's name; implied when `model` is given without a method): a smaller checkpoint with
    the target's vocabulary (`model`: a directory, hub id or .gguf file) proposes num_speculative_tokens tokens
    greedily, in the same process and the same step as the target's verification (runner.draft_model_runner).
    Its dtype follows the target's; it runs only at tensor_parallel_size 1, in CUDA graphs of its own at up to
    max_batch_size sequences (its catch-up of 1 + num_speculative_tokens tokens per sequence at most and its
    one-token decodes; a longer catch-up, e.g. of a prompt, runs eagerly).
    draft_sampling (draft_model): "greedy" (vLLM's way) proposes the draft's argmax, which the target accepts with
    probability p(d) at temperature > 0; "sampled" draws each draft from the draft's distribution q under the
    request's sampling parameters and accepts with min(1, p/q): more accepted when q is close to p at high
    temperature. Greedy requests (temperature 0) take the argmax either way; both are lossless.

    max_batch_size: a step with more running sequences than this runs without drafts. Speculation trades
    extra verified tokens (wasted when rejected) for fewer steps; that pays while a decode step is bound by
    reading the weights, i.e. at small batch. 32 is the default because a 0.6B-class model's decode step
    stays near its weight-read floor up to a few tens of sequences and, past that, rejected draft tokens
    cost real compute; measure the crossover per model and GPU (benchmarks/bench_spec_decode.py --sweep). Verify
    steps of up to max_batch_size sequences replay CUDA graphs of their own (runner.verify_graphs); with ngram,
    steps above it draft nothing and keep async scheduling.

    num_speculative_tokens defaults to 5: with adaptive_draft_length it is each sequence's most, not what every
    step drafts, and more pays on text that repeats (one H100, Qwen3-0.6B shape, ngram, prompts that repeat a
    pattern: batch 1 at 1.62x of plain with 3, 1.96x with 5, 2.13x with 7; batch 8 2.13x, 2.81x, 2.98x) while on
    random prompts 3, 5 and 7 all end within 3% of plain at batch 1. 7 gained less over 5 than 5 over 3, and each
    verify step computes 1 + num_speculative_tokens rows per sequence, and its CUDA graphs are captured that wide.

    adaptive_draft_length (on by default): num_speculative_tokens is each sequence's most, and each step a
    sequence drafts what its own recent acceptance pays for (spec_decode.draft_length_policy): all of them while
    nearly all are accepted, none while they are mostly rejected (then it probes again after a backoff that
    grows with each stop), so rejected drafts stop costing steps their pipelining. With draft_model, while every
    running sequence has stopped, steps run without the draft model and pipeline like plain decoding (a draft
    that loses is turned off; it catches up when a probe drafts again). Outputs are the same either way (every
    draft is verified); False drafts num_speculative_tokens wherever the lookup finds them (ngram) or in every
    step of at most max_batch_size sequences (draft_model, every step synchronous)."""

    method: str | None = None          # None: "draft_model" when `model` is given, else "ngram"
    num_speculative_tokens: int = 5    # vLLM has no default; the docstring above says why 5
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    max_batch_size: int = 32
    model: str | None = None           # draft_model: the draft checkpoint
    draft_sampling: str = "greedy"     # draft_model: DRAFT_SAMPLING
    adaptive_draft_length: bool = True

    def __post_init__(self) -> None:
        if self.method is None:        # vLLM infers the method from `model`
            object.__setattr__(self, "method", "ngram" if self.model is None else "draft_model")
        if self.method in NOT_YET_SUPPORTED_METHODS:
            raise ValueError(f"speculative_config.method {self.method!r} is not supported yet; "
                             f"supported: {list(SUPPORTED_METHODS)}")
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(SUPPORTED_METHODS)}, "
                             f"got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "max_batch_size"):
            _positive(name, getattr(self, name))
        if not isinstance(self.adaptive_draft_length, bool):
            raise ValueError(f"speculative_config.adaptive_draft_length must be true or false, got "
                             f"{self.adaptive_draft_length!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")
        if self.method == "draft_model" and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"speculative_config.method 'draft_model' needs \"model\": the draft checkpoint, "
                             f"got {self.model!r}")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("speculative_config.model is for method 'draft_model', not 'ngram'")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"speculative_config.draft_sampling must be one of {list(DRAFT_SAMPLING)}, got "
                             f"{self.draft_sampling!r}")
        if self.method == "ngram" and self.draft_sampling != "greedy":
            raise ValueError("speculative_config.draft_sampling is for method 'draft_model' (ngram drafts are "
                             "point masses)")

    @property
    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    def check_draft(self, draft_hf_config: Any, target_hf_config: Any, max_model_len: int,
                    tensor_parallel_size: int) -> None:
        """ValueError when the draft checkpoint cannot serve this target: another vocabulary size, a context
        shorter than max_model_len, or tensor parallelism (the draft runs unsharded)."""
        if tensor_parallel_size != 1:
            raise ValueError(f"draft_model needs tensor_parallel_size 1 for now, got {tensor_parallel_size}")
        draft_vocab, target_vocab = getattr(draft_hf_config, "vocab_size", None), target_hf_config.vocab_size
        if draft_vocab != target_vocab:
            raise ValueError(f"speculative_config.model {self.model!r} has vocab_size {draft_vocab}, the target "
                             f"{target_vocab}: a draft model must share the target's tokenizer and vocabulary")
        draft_len = getattr(draft_hf_config, "max_position_embeddings", None)
        if draft_len is not None and draft_len < max_model_len:
            raise ValueError(f"speculative_config.model {self.model!r} handles {draft_len} positions, fewer than "
                             f"max_model_len={max_model_len}: lower max_model_len to {draft_len}")

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
