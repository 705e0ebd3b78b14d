"""Request helpers: prompts to token ids, the model's tokenizer and its EOS ids."""
from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from nv_engine.config.engine_config import EngineConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Tokenizer: TypeAlias = "PreTrainedTokenizerBase"
# A prompt: text, token ids, or {"prompt_token_ids": [...], "prompt": optional text} / {"prompt": "..."}.
Prompt: TypeAlias = str | Sequence[int] | dict[str, str | Sequence[int]]


def prompt_to_ids(prompt: Prompt, tokenizer: Tokenizer | None, vocab_size: int) -> tuple[str | None, list[int]]:
    """(prompt text or None, token ids) from a string, a list of ids, or {"prompt_token_ids": [...]}
    / {"prompt": "..."}; ValueError for an empty prompt or an id outside [0, vocab_size)."""
    text = None
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            given = prompt.get("prompt")
            text = given if isinstance(given, str) else None
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
        to_list = getattr(prompt, "tolist", None)   # numpy / torch ids
        raw = prompt if to_list is None else to_list()
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


def load_tokenizer(config: EngineConfig) -> Tokenizer | None:
    """The model's HF tokenizer, or None (with a warning) when the checkpoint ships none."""
    from transformers import AutoTokenizer

    path = config.tokenizer or config.model
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # no tokenizer files: token-id prompts still work
        logger.warning("no tokenizer loaded from %s (%s); prompts must be token ids and outputs "
                       "have no text", path, exc)
        return None


def _as_id_list(value: int | Sequence[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def eos_token_ids(config: EngineConfig, tokenizer: Tokenizer | None) -> frozenset[int]:
    """Every EOS id of the generation config (or, without one, the model config) plus the tokenizer's."""
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        ids = _as_id_list(GenerationConfig.from_pretrained(config.model, trust_remote_code=False).eos_token_id)
    except Exception:
        pass
    if not ids:
        ids = _as_id_list(getattr(config.hf_config, "eos_token_id", None))
    tokenizer_eos = getattr(tokenizer, "eos_token_id", None)   # None without a tokenizer
    if tokenizer_eos is not None:
        ids.append(int(tokenizer_eos))
    return frozenset(ids)
