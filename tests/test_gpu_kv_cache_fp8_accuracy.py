"""FP8 KV cache accuracy at the Qwen3-0.6B shape on a CUDA GPU (random bf16 weights, seed 0), by the rule of
tests/test_kv_cache_fp8_accuracy.py (SmolLM2 on the CPU):
- greedy continuations of random token prompts with top-5 logprobs pass vLLM's check_logprobs_close against the
  default (bf16) cache; prompts are prefilled 256 tokens per step, so later chunks read FP8 K/V from the cache;
- perplexity within 3% of the default's, on its own greedy continuation of a prompt (a random model's greedy text
  repeats itself, so attention must find earlier tokens in the cached K/V; its perplexity stays high, ~10,700,
  since random weights spread their probability wide);
- a broken scale (8x too small: K/V clamp at e4m3's max) fails the rule.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from hf_compare import check_logprobs_close, nv_with_logprobs

import nv_engine.runner.kv_scales as kv_scales
from nv_engine import LLM, SamplingParams
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHUNK = 256                 # tokens per prefill step
TOP_LOGPROBS = 5
NEW_TOKENS = 32
PPL_TOLERANCE = 0.03
BROKEN_HEADROOM = 0.25      # calibration max x 1/4 fits e4m3: larger K/V clamp
_rng = random.Random(0)
PROMPTS = [[_rng.randrange(1, 10000) for _ in range(_rng.randrange(300, 700))] for _ in range(8)]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    path = nv_cache_dir() / "bench-random-qwen3-0.6b-bf16"        # shared with the benchmarks
    if not (path / "model.safetensors").exists():
        write_random_checkpoint(path, "qwen3-0.6b", dtype="bfloat16")
    return path


def _llm(model_dir: Path, **kwargs) -> LLM:
    return LLM(str(model_dir), max_model_len=2048, max_num_batched_tokens=CHUNK, enable_prefix_caching=False,
               gpu_memory_utilization=0.5, **kwargs)


def _greedy_with_logprobs(model_dir: Path, **kwargs):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS)
    with _llm(model_dir, **kwargs) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return nv_with_logprobs(outputs)


def _perplexity(model_dir: Path, text: list[int], scored_from: int, **kwargs) -> float:
    """exp(mean NLL) of text[scored_from:] under teacher forcing (prompt logprobs), CHUNK tokens per step."""
    with _llm(model_dir, **kwargs) as llm:
        (output,) = llm.generate([{"prompt_token_ids": text}], SamplingParams(prompt_logprobs=0, max_tokens=1),
                                 use_tqdm=False)
    nll = [-output.prompt_logprobs[j][text[j]].logprob for j in range(scored_from, len(text))]
    return math.exp(sum(nll) / len(nll))


@pytest.fixture(scope="module")
def default_greedy(model_dir: Path):
    return _greedy_with_logprobs(model_dir)


@pytest.fixture(scope="module")
def own_text(model_dir: Path) -> tuple[list[int], int]:
    """PROMPTS[0] and the default model's greedy continuation of it (1,024 tokens); scored from the prompt's end."""
    with _llm(model_dir) as llm:
        (output,) = llm.generate([{"prompt_token_ids": PROMPTS[0]}],
                                 SamplingParams(temperature=0.0, max_tokens=1024, ignore_eos=True), use_tqdm=False)
    return PROMPTS[0] + list(output.outputs[0].token_ids), len(PROMPTS[0])


@pytest.fixture(scope="module")
def default_perplexity(model_dir: Path, own_text: tuple[list[int], int]) -> float:
    value = _perplexity(model_dir, *own_text)
    # random weights spread their probability wide: 10,724 on an H200. A model that ignores its context would
    # score near the vocabulary's 151,936; the bound keeps the rule from judging such a reference.
    assert value < 151_936 / 8, value
    return value


def test_greedy_logprobs_close_to_the_default(model_dir: Path, default_greedy) -> None:
    check_logprobs_close(default_greedy, _greedy_with_logprobs(model_dir, kv_cache_dtype="fp8"), "auto", "fp8")


def test_perplexity_within_3_percent_of_the_default(model_dir: Path, own_text, default_perplexity: float) -> None:
    fp8 = _perplexity(model_dir, *own_text, kv_cache_dtype="fp8")
    assert abs(fp8 / default_perplexity - 1) < PPL_TOLERANCE, (default_perplexity, fp8)


def test_a_broken_scale_fails_the_rule(model_dir: Path, default_greedy, own_text, default_perplexity: float,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_scales, "HEADROOM", BROKEN_HEADROOM)
    fp8 = _perplexity(model_dir, *own_text, kv_cache_dtype="fp8")
    try:
        check_logprobs_close(default_greedy, _greedy_with_logprobs(model_dir, kv_cache_dtype="fp8"), "auto", "fp8")
    except AssertionError:
        return
    assert fp8 / default_perplexity - 1 > PPL_TOLERANCE, (default_perplexity, fp8)
