"""The INT4 GEMM kernel compiles for Hopper (sm_90) on a machine without a GPU, for each launch the heuristic picks
at the Qwen3-8B shapes (the pairs launch for 1-16 rows with split K, decode tiles with split K, mid-size and prefill
tiles; bf16, fp16 with a bias, gate_up with SiLU-and-mul fused), within an SM's shared memory. The interpreter tests
(test_int4_gemm) check numerics; this catches what only the compiler refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

from nv_kernels.testing import SM90_SHARED_MEMORY, ptxas_available, run_compile_script


@pytest.mark.slow
@pytest.mark.skipif(not ptxas_available(), reason="needs triton with its NVIDIA backend (ptxas)")
def test_int4_gemm_compiles_for_sm90(tmp_path: Path) -> None:
    result = run_compile_script(__file__, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled 10 launches" in result.stdout


def _compile_all() -> None:
    import torch

    from nv_kernels.int4_gemm import GROUP, choose_config
    from nv_kernels.int4_gemm_kernel import int4_gemm_kernel
    from nv_kernels.testing import compile_for_gpu

    k, n = 4096, 6144                                          # Qwen3-8B qkv_proj
    qweight = torch.zeros(n, k // 8, dtype=torch.int32)
    scales = torch.ones(k // GROUP, n, dtype=torch.float16)
    zeros = torch.zeros(k // GROUP, n, dtype=torch.uint8)
    # (rows, dtype, bias, gated)
    launches = [(m, torch.bfloat16, False, False) for m in (1, 9, 16, 48, 512)]
    launches += [(1, torch.float16, True, False), (16, torch.float16, True, False), (1, torch.bfloat16, False, True),
                 (16, torch.bfloat16, False, True), (512, torch.bfloat16, False, True)]
    for m, dtype, bias, gated in launches:
        n_out = n // 2 if gated else n
        cfg = choose_config(m, n_out, k, 132)
        x, y = torch.zeros(m, k, dtype=dtype), torch.empty(m, n_out, dtype=dtype)
        partials, counters = torch.empty(cfg.split_k, m, n), torch.zeros(n // cfg.block_n, dtype=torch.int32)
        args = (x, qweight, scales, zeros, y, y, partials, counters, m, n_out, k, 8, cfg.split_k, x.stride(0),
                qweight.stride(0), scales.stride(0), y.stride(0), partials.stride(0))
        options = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_DOT=cfg.use_dot, SPLIT=cfg.split_k > 1,
                       GATED=gated, HAS_BIAS=bias, DOT_IN_FP32=False, NUM_STAGES=cfg.num_stages, PAIRS=cfg.pairs,
                       num_warps=cfg.num_warps, num_stages=cfg.num_stages, USE_PDL=m == 1)   # as on Hopper
        compiled = compile_for_gpu(int4_gemm_kernel, args, options)
        if compiled.metadata.shared > SM90_SHARED_MEMORY:
            raise SystemExit(f"m={m}: {compiled.metadata.shared} bytes of shared memory, more than sm_90 allows")
    print(f"compiled {len(launches)} launches")


if __name__ == "__main__":
    _compile_all()
