"""The block-FP8 GEMM kernel compiles for Hopper (sm_90, where FP8 dot products exist) on a machine without a GPU,
at each of its tile shapes (decode, mid-size and prefill batches), within an SM's shared memory. The interpreter
tests (test_fp8_block_gemm) check numerics; this catches what only the compiler refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

from nv_kernels.testing import SM90_SHARED_MEMORY, ptxas_available, run_compile_script


@pytest.mark.slow
@pytest.mark.skipif(not ptxas_available(), reason="needs triton with its NVIDIA backend (ptxas)")
def test_fp8_block_gemm_compiles_for_sm90(tmp_path: Path) -> None:
    result = run_compile_script(__file__, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled 3 tile shapes" in result.stdout


def _compile_all() -> None:
    import torch

    import nv_kernels.fp8_block_gemm as fp8_block_gemm
    from nv_kernels.fp8_block_gemm_kernel import fp8_block_gemm_kernel
    from nv_kernels.testing import compile_for_gpu

    k, n = 4096, 6144
    w_q = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.ones(n // 128, k // 128)
    for m in (1, 48, 512):
        block_m, block_n, num_warps = fp8_block_gemm.tile_shape(m)
        x, y = torch.zeros(m, k, dtype=torch.bfloat16), torch.empty(m, n, dtype=torch.bfloat16)
        args = (x, w_q, scale, y, y, m, n, k, x.stride(0), w_q.stride(0), scale.stride(0), y.stride(0))
        compiled = compile_for_gpu(fp8_block_gemm_kernel, args, dict(HAS_BIAS=False, BLOCK_M=block_m,
                                                                      BLOCK_N=block_n, num_warps=num_warps))
        if compiled.metadata.shared > SM90_SHARED_MEMORY:
            raise SystemExit(f"m={m}: {compiled.metadata.shared} bytes of shared memory, more than sm_90 allows")
    print("compiled 3 tile shapes")


if __name__ == "__main__":
    _compile_all()
