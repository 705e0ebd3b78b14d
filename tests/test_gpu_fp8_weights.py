"""Block-FP8 weights on a CUDA GPU: the Triton W8A8 GEMM equals its torch reference at Qwen3-8B projection shapes
(decode, mid-size and prefill rows), and a random-weight Qwen3-8B-shape bf16 checkpoint quantized by nv when
loaded (`quantization="fp8"`) gives greedy outputs within vLLM's check_logprobs_close (top-5) of the bf16 model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_compare import check_logprobs_close, nv_with_logprobs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TOP_K = 5


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [1, 7, 48, 300])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288)])     # Qwen3-8B: qkv, down
def test_kernel_matches_its_reference_at_8b_shapes(m: int, n: int, k: int) -> None:
    from nv_kernels.fp8_block_gemm import fp8_block_gemm_torch, fp8_block_gemm_triton, quantize_fp8_block

    gen = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    w_q, scale = quantize_fp8_block(0.02 * torch.randn(n, k, generator=gen, device="cuda"))
    got = fp8_block_gemm_triton(x, w_q, scale).float()
    want = fp8_block_gemm_torch(x.float(), w_q, scale)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.gpu
@needs_cuda
def test_online_fp8_8b_shape_is_close_to_bf16() -> None:
    from nv_engine import LLM, SamplingParams
    from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

    model = nv_cache_dir() / "bench-random-qwen3-8b-bf16"          # shared with the benchmarks
    if not list(Path(model).glob("*.safetensors")):
        write_random_checkpoint(model, "qwen3-8b", dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 10000, (n,), generator=gen).tolist()} for n in (5, 40, 200, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=TOP_K, ignore_eos=True)
    outputs = {}
    for quantization in (None, "fp8"):
        with LLM(str(model), max_model_len=1024, quantization=quantization, gpu_memory_utilization=0.8) as llm:
            outputs[quantization] = nv_with_logprobs(llm.generate(prompts, params, use_tqdm=False))
    check_logprobs_close(outputs[None], outputs["fp8"], "bf16", "fp8")
