"""The FP8-weight skinny GEMM's kernel compiles for Hopper (sm_90) on a machine without a GPU, in the variants the
layers launch at the Qwen3-8B shape (one row: one K tile per program with dependent launch, plain and gated, and the
split K loop of down; 16 rows: tl.dot, gated and split), within an SM's shared memory and without spilling
registers to local memory. The interpreter tests (test_fp8_skinny_gemm) check numerics; this catches what only the
compiler refuses or makes slow."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from nv_kernels.testing import SM90_SHARED_MEMORY, ptxas_available, run_compile_script

# (weight rows, K, M, gated): Qwen3-8B qkv, gate_up and down at one row, gate_up and o at 16 rows
VARIANTS = [(6144, 4096, 1, False), (24576, 4096, 1, True), (4096, 12288, 1, False), (24576, 4096, 16, True),
            (4096, 4096, 16, False)]



@pytest.mark.slow
@pytest.mark.skipif(not ptxas_available(), reason="needs triton with its NVIDIA backend (ptxas)")
def test_fp8_skinny_gemm_compiles_for_sm90(tmp_path: Path) -> None:
    result = run_compile_script(__file__, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"compiled {len(VARIANTS)} variants" in result.stdout


def _spilled_bytes(cubin: bytes, tmp: Path) -> int:
    """Local memory per thread of the compiled kernel (cuobjdump's resource usage), 0 when cuobjdump is missing."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return 0
    (tmp / "kernel.cubin").write_bytes(cubin)
    usage = subprocess.run([str(tool), "-res-usage", str(tmp / "kernel.cubin")], capture_output=True, text=True)
    fields = dict(f.split(":") for f in usage.stdout.split() if f.count(":") == 1 and f.split(":")[1].isdigit())
    return int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0))


def _compile_all() -> None:
    import tempfile

    import torch

    from nv_kernels.fp8_skinny_gemm_config import choose_fp8_config
    from nv_kernels.fp8_skinny_gemm_kernel import fp8_skinny_gemm_kernel
    from nv_kernels.skinny_gemm_config import m_bucket
    from nv_kernels.testing import compile_for_gpu

    for rows, k, m, gated in VARIANTS:
        cfg = choose_fp8_config(rows, k, m, gated)
        n = rows // 2 if gated else rows
        k_per_split = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
        split_k = math.ceil(k / k_per_split)
        w_q = torch.zeros(rows, k, dtype=torch.float8_e4m3fn)
        scale = torch.ones(rows // 128, k // 128)
        x, y = torch.zeros(m, k, dtype=torch.bfloat16), torch.empty(m, n, dtype=torch.bfloat16)
        partials, counters = torch.empty(split_k, m, rows), torch.zeros(64, dtype=torch.int32)
        args = (x, w_q, scale, y, y, partials, counters, m, n, k, k_per_split, x.stride(0), w_q.stride(0),
                scale.stride(0), y.stride(0), partials.stride(-2), partials.stride(0), n * w_q.stride(0))
        m_pad = max(16, m_bucket(m)) if cfg.use_dot else m_bucket(m)
        compiled = compile_for_gpu(fp8_skinny_gemm_kernel, args, dict(
            M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot, GATED=gated, HAS_BIAS=False,
            SPLIT_K=split_k, EVEN_K=True, DOT_IN_FP32=False, NUM_STAGES=cfg.num_stages, USE_PDL=m == 1,
            ONE_TILE=k_per_split == cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        if compiled.metadata.shared > SM90_SHARED_MEMORY:
            raise SystemExit(f"{(rows, k, m, gated)}: {compiled.metadata.shared} bytes of shared memory")
        with tempfile.TemporaryDirectory() as tmp:
            spilled = _spilled_bytes(compiled.asm["cubin"], Path(tmp))
        if spilled:
            raise SystemExit(f"{(rows, k, m, gated)} with {cfg}: {spilled} bytes of registers spilled per thread")
    print(f"compiled {len(VARIANTS)} variants")


if __name__ == "__main__":
    _compile_all()
