"""Tensor parallelism on two GPUs (NCCL and the symmetric-memory all-reduce); skipped with fewer than 2 GPUs.

- the custom all-reduce equals NCCL's sum and is bitwise the same on every rank, for [1..256, 4096]
  bf16, eagerly and replayed from a CUDA graph; larger tensors go to NCCL.
- fp32: TP=2 gives exactly TP=1's greedy tokens (with and without the custom all-reduce).
- bf16 seeded sampling at TP=2: async scheduling (each rank feeds its own sampled ids into the
  next step) draws exactly the synchronous run's tokens, so every rank sampled rank 0's ids.
- bf16 at the Qwen3-0.6B shape: TP=2 and TP=1 each follow HF by vLLM's check_logprobs_close rule.
- a worker killed mid-run makes the engine raise within seconds.
"""
from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
import torch
from hf_compare import check_logprobs_close, hf_greedy, hf_with_logprobs, load_hf, nv_with_logprobs, random_prompts

from nv_engine import LLM, SamplingParams
from nv_engine.executor.testing import run_torchrun

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # never NVLink multicast on shared hosts


@pytest.fixture(scope="module")
def qwen3_06b_dirs(tmp_path_factory):
    from nv_engine.model_loader.random_model import write_random_checkpoint

    root = tmp_path_factory.mktemp("tp")
    return {dtype: write_random_checkpoint(root / dtype, "qwen3-0.6b", dtype=dtype)
            for dtype in ("bfloat16", "float32")}


def _generate(model_dir, tp: int, prompts, params, **kwargs):
    llm = LLM(str(model_dir), tensor_parallel_size=tp, gpu_memory_utilization=0.4, max_model_len=1024, **kwargs)
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()


ALL_REDUCE_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from nv_layers.parallel_state import custom_all_reduce, init_custom_all_reduce, tp_all_reduce

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", rank)
    assert init_custom_all_reduce(device, torch.bfloat16), "symmetric memory unavailable"
    reducer = custom_all_reduce()
    world = dist.get_world_size()
    for rows in (1, 2, 3, 8, 32, 64, 128, 255, 256):
        gen = torch.Generator(device=device).manual_seed(1000 * rows + rank)
        x = torch.randn(rows, 4096, dtype=torch.bfloat16, device=device, generator=gen)
        assert reducer.can_reduce(x)
        nccl = x.clone()
        dist.all_reduce(nccl)
        eager = tp_all_reduce(x.clone())
        static = x.clone()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            tp_all_reduce(static)
        for _ in range(3):                      # replays: the barriers reset themselves
            static.copy_(x)
            graph.replay()
        torch.cuda.synchronize()
        for name, got in (("eager", eager), ("graph", static)):
            if world == 2:                      # a + b rounded once, as NCCL does
                assert torch.equal(got, nccl), (name, rows, (got.float() - nccl.float()).abs().max().item())
            else:
                torch.testing.assert_close(got, nccl, rtol=2e-2, atol=2e-2)
            parts = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(parts, got)
            assert all(torch.equal(p, parts[0]) for p in parts), (name, rows, "ranks differ")
    big = torch.ones(2048 + 1, 4096, dtype=torch.bfloat16, device=device)   # over the 8 MiB buffer
    assert not reducer.can_reduce(big)
    assert torch.equal(tp_all_reduce(big), torch.full_like(big, world))
    print(f"rank {rank} all-reduce OK", flush=True)
    dist.destroy_process_group()
""")


def test_custom_all_reduce_equals_nccl_bitwise_on_every_rank(tmp_path):
    script = tmp_path / "all_reduce_script.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    proc = run_torchrun(str(script), nproc=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0 all-reduce OK" in out and "rank 1 all-reduce OK" in out, out


@pytest.mark.parametrize("disable_custom_all_reduce", [False, True])
def test_tp2_fp32_greedy_equals_tp1(qwen3_06b_dirs, disable_custom_all_reduce):
    prompts = random_prompts([12, 100, 333, 37, 5, 700], seed=11, vocab=151936)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    tp1 = [o.outputs[0].token_ids for o in _generate(qwen3_06b_dirs["float32"], 1, prompts, params)]
    llm = LLM(str(qwen3_06b_dirs["float32"]), tensor_parallel_size=2, gpu_memory_utilization=0.4, max_model_len=1024,
              disable_custom_all_reduce=disable_custom_all_reduce)
    try:
        assert llm.llm_engine.async_scheduling
        # rank 0's runner (in this process) says whether the symmetric-memory all-reduce is on
        assert llm.llm_engine.executor.run_on_all_ranks("uses_custom_all_reduce") is (not disable_custom_all_reduce)
        tp2 = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()
    assert tp2 == tp1


def test_tp2_bf16_seeded_sampling_async_equals_sync(qwen3_06b_dirs):
    prompts = random_prompts([40, 7, 300, 90, 12, 150, 64, 3], seed=5, vocab=151936)
    params = [SamplingParams(temperature=t, top_p=p, seed=i, max_tokens=48, ignore_eos=True)
              for i, (t, p) in enumerate([(1.0, 1.0), (0.7, 0.9), (1.3, 1.0), (0.0, 1.0)] * 2)]
    runs = {mode: [o.outputs[0].token_ids for o in _generate(qwen3_06b_dirs["bfloat16"], 2, prompts, params,
                                                              async_scheduling=mode)]
            for mode in (True, False)}
    assert runs[True] == runs[False]


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
