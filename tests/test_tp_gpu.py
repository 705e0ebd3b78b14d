"""Tensor parallelism on two GPUs over NCCL; skipped with fewer than 2 GPUs.

- fp32: TP=2 gives exactly TP=1's greedy tokens (same math, only the all-reduce order differs).
- bf16 at the Qwen3-0.6B shape: TP=2 and TP=1 each follow HF by vLLM's check_logprobs_close rule.
- a worker killed mid-run makes the engine raise within seconds.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from hf_compare import check_logprobs_close, hf_greedy, hf_with_logprobs, load_hf, nv_with_logprobs, random_prompts

from nv_engine import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # never NVLink multicast on shared hosts


@pytest.fixture(scope="module")
def qwen3_06b_dirs(tmp_path_factory):
    from nv_engine.checkpoints.random_model import write_random_checkpoint

    root = tmp_path_factory.mktemp("tp")
    return {dtype: write_random_checkpoint(root / dtype, "qwen3-0.6b", dtype=dtype)
            for dtype in ("bfloat16", "float32")}


def _generate(model_dir, tp: int, prompts, params, **kwargs):
    llm = LLM(str(model_dir), tensor_parallel_size=tp, gpu_memory_utilization=0.4, max_model_len=1024, **kwargs)
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()


def test_tp2_fp32_greedy_equals_tp1(qwen3_06b_dirs):
    prompts = random_prompts([12, 100, 333, 37, 5, 700], seed=11, vocab=151936)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    tp1 = [o.outputs[0].token_ids for o in _generate(qwen3_06b_dirs["float32"], 1, prompts, params)]
    tp2 = [o.outputs[0].token_ids for o in _generate(qwen3_06b_dirs["float32"], 2, prompts, params)]
    assert tp2 == tp1


def test_tp2_bf16_follows_hf_and_tp1(qwen3_06b_dirs):
    prompts = random_prompts([12, 100, 333, 37], seed=8, vocab=151936)
    k, n = 5, 32
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=k)
    tp1 = nv_with_logprobs(_generate(qwen3_06b_dirs["bfloat16"], 1, prompts, params))
    tp2 = nv_with_logprobs(_generate(qwen3_06b_dirs["bfloat16"], 2, prompts, params))
    hf = load_hf(qwen3_06b_dirs["bfloat16"], dtype=torch.bfloat16, device="cuda")
    refs = hf_with_logprobs([hf_greedy(hf, p, n) for p in prompts], k)
    del hf
    torch.cuda.empty_cache()
    check_logprobs_close(tp2, refs, "nv tp2", "hf")
    check_logprobs_close(tp2, tp1, "nv tp2", "nv tp1")
    same = sum(a[0] == b[0] for a, b in zip(tp1, tp2, strict=True))
    print(f"bf16: {same}/{len(prompts)} prompts with identical greedy tokens at TP=2 and TP=1")


def test_killed_worker_raises_within_seconds(qwen3_06b_dirs):
    llm = LLM(str(qwen3_06b_dirs["bfloat16"]), tensor_parallel_size=2, gpu_memory_utilization=0.4,
              max_model_len=1024)
    try:
        engine = llm.llm_engine
        pids = [pid for rank, pid in engine.executor.worker_pids.items() if pid != os.getpid()]
        assert pids, "no worker process found"
        prompts = random_prompts([50] * 8, seed=3, vocab=151936)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), {"prompt_token_ids": p}, SamplingParams(max_tokens=2000, ignore_eos=True))
        engine.step()
        os.kill(pids[0], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RuntimeError):
            for _ in range(10_000):
                engine.step()
        assert time.monotonic() - start < 10
    finally:
        llm.shutdown()
