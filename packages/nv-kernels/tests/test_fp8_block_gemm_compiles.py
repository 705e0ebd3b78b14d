"""The block-FP8 GEMM's kernels compile for Hopper (sm_90, where FP8 dot products exist) on a machine without a
GPU: the activations' quantization, and the GEMM at each of its tile shapes (decode, mid-size and prefill batches)
within an SM's shared memory, its 64- and 128-row tiles on the warpgroup tensor-core instructions (wgmma). The
interpreter tests (test_fp8_block_gemm) check numerics; this catches what only the compiler refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

from nv_kernels.testing import SM90_SHARED_MEMORY, ptxas_available, run_compile_script


@pytest.mark.slow
@pytest.mark.skipif(not ptxas_available(), reason="needs triton with its NVIDIA backend (ptxas)")
def test_fp8_block_gemm_compiles_for_sm90(tmp_path: Path) -> None:
    result = run_compile_script(__file__, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled 5 tile shapes and the activation kernel" in result.stdout


def _compile_all() -> None:
    import torch

    import nv_kernels.fp8_block_gemm as fp8_block_gemm
    from nv_kernels.fp8_act_quant_kernel import fp8_act_quant_kernel
    from nv_kernels.fp8_block_gemm_kernel import fp8_block_gemm_kernel
    from nv_kernels.testing import compile_for_gpu

    k = 4096
    for m, n in ((1, 6144), (48, 6144), (256, 4096), (512, 6144), (8192, 6144)):
        block_m, block_n, num_warps, num_stages = fp8_block_gemm.tile_shape(m, n, 132)
        w_q = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
        scale = torch.ones(n // 128, k // 128)
        x_q, x_scale = torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(k // 128, m)
        y = torch.empty(m, n, dtype=torch.bfloat16)
        args = (x_q, x_scale, w_q, scale, y, y, m, n, k, x_q.stride(0), x_scale.stride(0), w_q.stride(0),
                scale.stride(0), y.stride(0))
        compiled = compile_for_gpu(fp8_block_gemm_kernel, args, dict(
            HAS_BIAS=False, EVEN_K=True, BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=fp8_block_gemm.GROUP_M, PAIRED=True,
            num_warps=num_warps, num_stages=num_stages))
        if compiled.metadata.shared > SM90_SHARED_MEMORY:
            raise SystemExit(f"m={m}: {compiled.metadata.shared} bytes of shared memory, more than sm_90 allows")
        if block_m >= 64 and "wgmma" not in compiled.asm["ptx"]:
            raise SystemExit(f"m={m}: {block_m}-row tiles without wgmma")
    x = torch.zeros(300, k, dtype=torch.bfloat16)
    compile_for_gpu(fp8_act_quant_kernel, (x, x_q, x_scale, 300, k, x.stride(0), k, 300), dict(BLOCK_R=16))
    print("compiled 5 tile shapes and the activation kernel")


if __name__ == "__main__":
    _compile_all()
