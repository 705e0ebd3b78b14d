"""The decode step's large Triton kernels compile for Hopper (sm_90) on a machine without a GPU: the split decode
(plain at 16 rows, and at one row finishing q / k itself with its first KV tile read ahead) and the batch-1 skinny
GEMMs (one K tile per program), with the launch options the GPU uses (dependent launch, Qwen3-0.6B shapes) and
the arguments specialized as a launch specializes them, within an SM's shared memory. The CPU suite runs
kernels in Triton's interpreter, which accepts code the compiler refuses (a constexpr that is not one, a type
mismatch between branches); this compiles them for real in a subprocess without TRITON_INTERPRET."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nv_kernels.testing import SM90_SHARED_MEMORY, ptxas_available, run_compile_script


@pytest.mark.slow   # about 5 s on two cores
@pytest.mark.skipif(not ptxas_available(), reason="needs triton with its NVIDIA backend (ptxas)")
def test_decode_kernels_compile_for_sm90(tmp_path: Path) -> None:
    result = run_compile_script(__file__, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled 4 kernels" in result.stdout


def _compile_all() -> None:
    import torch

    import nv_kernels.skinny_gemm as skinny_gemm
    import nv_kernels.triton_decode as triton_decode
    from nv_kernels.decode_rope import DecodeRope
    from nv_kernels.skinny_gemm_config import SkinnyGemmConfig
    from nv_kernels.testing import compile_for_gpu, random_paged_batch

    launches: list[tuple[Any, tuple, dict[str, Any]]] = []

    class Capture:
        """Stands in for a kernel: records each launch's arguments instead of running it."""

        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple) -> Any:
            return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))

    triton_decode._decode_split_kernel = Capture(triton_decode._decode_split_kernel)
    skinny_gemm.skinny_gemm_kernel = Capture(skinny_gemm.skinny_gemm_kernel)
    hidden, hq, hkv, d, inter = 1024, 16, 8, 128, 3072
    bf16 = torch.bfloat16

    def zeros(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype)

    for rows in (1, 16):
        b = random_paged_batch([100] * rows, [1] * rows, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                               block_size=16, dtype=bf16)
        rope = None if rows == 16 else DecodeRope(
            k=zeros(rows, hkv, d), v=zeros(rows, hkv, d), positions=b.seq_lens.long(), slot_mapping=b.slot_mapping,
            cos_sin_cache=zeros(4096, d, dtype=torch.float32), q_weight=zeros(d), k_weight=zeros(d))
        # one row: the first KV tile read before the dependent-launch wait, as the GPU runs batch 1
        triton_decode.decode_attention(zeros(rows, hq, d), b.k_cache, b.v_cache, b.seq_lens, b.block_tables, 4096,
                                       0.088, num_splits=4, rope=rope, preload=rows == 1)
    # the batch-1 GEMMs: one K tile per program, the weight loaded before the wait (gated + norm; a masked K tail)
    one_row = zeros(1, hidden)
    skinny_gemm.skinny_norm_gemm(one_row, one_row, zeros(hidden), 1e-6, zeros(2 * inter, hidden), gated=True,
                                 config=SkinnyGemmConfig(4, 1024, 1, 2, 1, False))
    skinny_gemm.skinny_gemm(zeros(1, inter), zeros(hidden, inter), config=SkinnyGemmConfig(4, 4096, 1, 4, 1, False))
    for kernel, args, kwargs in launches:
        # the GPU's choices where the CPU launchers pick the interpreter's
        on_gpu = dict(kwargs, USE_PDL=True, TILE=32)
        if "DOT_IN_FP32" in kwargs:
            on_gpu["DOT_IN_FP32"] = False
        compiled = compile_for_gpu(kernel, args, on_gpu)
        if compiled.metadata.shared > SM90_SHARED_MEMORY:
            raise SystemExit(f"{kernel.__name__} needs {compiled.metadata.shared} bytes of shared memory, more than "
                             f"an sm_90 program may have ({SM90_SHARED_MEMORY})")
    print(f"compiled {len(launches)} kernels")


if __name__ == "__main__":
    _compile_all()
