"""SamplingParams.prompt_logprobs against HF transformers' log_softmax on the tiny Qwen3 (CPU, fp32):
in one step, over chunked prefill, next to requests without them, and for a prompt already in
the prefix cache (the request still computes every prompt position)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_compare import load_hf, random_prompts

from nv_engine import LLM, LLMEngine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tests/conftest.py

TOP_K = 3


@pytest.fixture(scope="module")
def hf_prompt_logprobs(tiny_qwen3_dir):
    model = load_hf(tiny_qwen3_dir)

    @torch.no_grad()
    def ref(prompt: list[int]) -> torch.Tensor:
        """[len(prompt) - 1, V]: row j is the distribution of prompt token j + 1."""
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
        return torch.log_softmax(logits, dim=-1)

    return ref


def assert_matches_hf(prompt: list[int], got, ref: torch.Tensor, k: int) -> None:
    assert got is not None and len(got) == len(prompt)
    assert got[0] is None
    for position in range(1, len(prompt)):
        entry, row = got[position], ref[position - 1]
        assert entry is not None
        token = prompt[position]
        assert token in entry
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        top = row.topk(k)
        ranked = zip(top.values.tolist(), top.indices.tolist(), strict=True)
        for rank, (logprob, token_id) in enumerate(ranked, start=1):
            assert entry[token_id].logprob == pytest.approx(logprob, abs=1e-4)
            assert entry[token_id].rank == rank
        assert set(entry) <= {token, *top.indices.tolist()}


@pytest.mark.parametrize("budget", [16, None], ids=["chunked", "one_step"])
def test_prompt_logprobs_match_hf(tiny_qwen3_dir, hf_prompt_logprobs, budget):
    prompts = random_prompts([5, 37, 50], seed=3)
    kwargs = {"max_num_batched_tokens": budget} if budget else {}
    llm = LLM(str(tiny_qwen3_dir), block_size=16, **kwargs)
    try:
        wanted = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=TOP_K)
        plain = SamplingParams(temperature=0.0, max_tokens=3)
        outputs = llm.generate(prompts + [prompts[1]], [wanted, wanted, wanted, plain], use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outputs[:3], strict=True):
        assert_matches_hf(prompt, out.prompt_logprobs, hf_prompt_logprobs(prompt), TOP_K)
    assert outputs[3].prompt_logprobs is None


def test_prompt_logprobs_zero_gives_the_prompt_tokens_only(tiny_qwen3_dir, hf_prompt_logprobs):
    prompt = random_prompts([20], seed=4)[0]
    llm = LLM(str(tiny_qwen3_dir), block_size=16, max_num_batched_tokens=8)
    try:
        out = llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=0), use_tqdm=False)[0]
    finally:
        llm.shutdown()
    got = out.prompt_logprobs
    assert_matches_hf(prompt, got, hf_prompt_logprobs(prompt), 0)
    assert got is not None
    for entry, token in zip(got[1:], prompt[1:], strict=True):
        assert entry is not None and list(entry) == [token]
        assert entry[token].decoded_token is not None


def test_prompt_in_prefix_cache_is_computed_again(tiny_qwen3_dir, hf_prompt_logprobs):
    prompt = random_prompts([70], seed=5)[0]
    engine = LLMEngine(model=str(tiny_qwen3_dir), block_size=16, stream_outputs=False)
    try:
        def run(request_id: str, params: SamplingParams):
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            outputs = []
            while engine.has_unfinished_requests():
                outputs.extend(engine.step())
            return outputs[-1]

        run("warm", SamplingParams(max_tokens=1))
        cached = run("plain", SamplingParams(max_tokens=1))
        assert cached.num_cached_tokens == 64          # the prompt's full blocks are cached
        first = run("a", SamplingParams(max_tokens=2, prompt_logprobs=2))
        second = run("b", SamplingParams(max_tokens=2, prompt_logprobs=2))
    finally:
        engine.shutdown()
    ref = hf_prompt_logprobs(prompt)
    assert_matches_hf(prompt, first.prompt_logprobs, ref, 2)
    assert_matches_hf(prompt, second.prompt_logprobs, ref, 2)


def test_prompt_logprobs_validation(tiny_qwen3_dir):
    bad_values: list[Any] = [-1, 21, 1.5, True]
    for bad in bad_values:
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)
    llm = LLM(str(tiny_qwen3_dir), max_logprobs=2)
    try:
        with pytest.raises(ValueError, match="prompt_logprobs=3 is more than max_logprobs=2"):
            llm.generate(["hello"], SamplingParams(prompt_logprobs=3), use_tqdm=False)
        out = llm.generate(["hello world"], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)
    finally:
        llm.shutdown()
    got = out[0].prompt_logprobs
    assert got is not None and got[0] is None and len(got) == len(out[0].prompt_token_ids)
