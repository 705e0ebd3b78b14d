"""The engine's per-request state (a Request with its n Completions) and prompt handling."""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

from nv_kvcache import FinishReason, Sequence, StopRules

from nv_engine.config import EngineConfig
from nv_engine.outputs import CompletionOutput, RequestOutput
from nv_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Completion:
    """One of a request's n completions; hangs on its Sequence as `payload`."""

    request: "Request"
    index: int
    seed: int
    detok: Any                                  # IncrementalDetokenizer, or None (decode at the end)
    logprobs: list | None = None                # per token: {token id: Logprob}
    cumulative_logprob: float = 0.0
    seq: Sequence | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    quiet: bool = False                         # engine fast path: see LLMEngine._new_sequence
    stop_ids: frozenset[int] = frozenset()      # EOS + stop token ids (rules.stopping_ids)
    _final_text: str | None = None

    def text(self, tokenizer: Any) -> str:
        finished = self.finish_reason is not None
        if self.detok is not None:
            return self.detok.stream_text(finished)
        if tokenizer is None or not finished:
            return ""
        if self._final_text is None:
            # A multi-byte character cut at the end decodes to U+FFFD: dropped, as the incremental
            # detokenizer never emits it either.
            self._final_text = tokenizer.decode(
                self.seq.output_token_ids, skip_special_tokens=self.request.params.skip_special_tokens,
                clean_up_tokenization_spaces=False).rstrip("\ufffd")
        return self._final_text

    def to_output(self, tokenizer: Any) -> CompletionOutput:
        return CompletionOutput(
            index=self.index, text=self.text(tokenizer), token_ids=list(self.seq.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            finish_reason=self.finish_reason.value if self.finish_reason is not None else None,
            stop_reason=self.stop_reason)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    rules: StopRules
    completions: list[Completion] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return len(self.completions) == self.params.n and all(
            c.finish_reason is not None for c in self.completions)

    def to_output(self, tokenizer: Any) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=[c.to_output(tokenizer) for c in self.completions], finished=self.finished,
            num_cached_tokens=self.completions[0].seq.num_cached_tokens)


def prompt_to_ids(prompt: Any, tokenizer: Any, vocab_size: int) -> tuple[str | None, list[int]]:
    """(prompt text or None, token ids) from a string, a list of ids, or {"prompt_token_ids": [...]}
    / {"prompt": "..."}; ValueError for an empty prompt or an id outside [0, vocab_size)."""
    text = None
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            text = prompt.get("prompt") if isinstance(prompt.get("prompt"), str) else None
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise ValueError("a prompt dict needs 'prompt_token_ids' or 'prompt'")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as token ids")
        text = prompt
        ids = list(tokenizer.encode(prompt))
    elif isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):  # ids (text kept if given)
        raw = prompt.tolist() if hasattr(prompt, "tolist") else prompt
        try:
            ids = [operator.index(t) for t in raw]
        except TypeError:
            raise ValueError("a token-id prompt must hold integers only") from None
    else:
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, got "
                         f"{type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    return text, ids


def load_tokenizer(config: EngineConfig) -> Any:
    """The model's HF tokenizer, or None (with a warning) when the checkpoint ships none."""
    from transformers import AutoTokenizer

    path = config.tokenizer or config.model
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # no tokenizer files: token-id prompts still work
        logger.warning("no tokenizer loaded from %s (%s); prompts must be token ids and outputs "
                       "have no text", path, exc)
        return None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def eos_token_ids(config: EngineConfig, tokenizer: Any) -> frozenset[int]:
    """Every EOS id of the generation config (or, without one, the model config) plus the tokenizer's."""
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        ids = _as_id_list(GenerationConfig.from_pretrained(config.model, trust_remote_code=False).eos_token_id)
    except Exception:
        pass
    if not ids:
        ids = _as_id_list(getattr(config.hf_config, "eos_token_id", None))
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return frozenset(ids)
