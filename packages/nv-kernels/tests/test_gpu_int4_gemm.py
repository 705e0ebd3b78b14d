"""The INT4 GEMM on a CUDA GPU at Qwen3-8B projection shapes (pytest -m gpu): the Triton kernel equals the
dequantize-then-matmul reference for decode (1, 16 rows: split K) and prefill-size (256 rows) batches, bf16 and
fp16, also with SiLU-and-mul fused (gate_up); a CUDA-graph replay of a split-K launch gives the eager result (the
counters are reused, never refilled)."""
from __future__ import annotations

import pytest
import torch

from nv_kernels.testing import relative_error

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SHAPES = [(12288, 4096), (4096, 4096), (6144, 4096), (4096, 12288)]    # (N, K): gate_up / 2, o, qkv, down


def random_int4(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from nv_kernels.int4_gemm import pack_int4_weight, quantize_int4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return pack_int4_weight(*quantize_int4(0.02 * torch.randn(n, k, generator=gen, device="cuda")))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_matches_its_reference_at_8b_shapes(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    from nv_kernels.int4_gemm import int4_gemm, int4_gemm_torch

    qweight, scales, zeros = random_int4(n, k, m + n + k)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(m)).to(dtype)
    got = int4_gemm(x, qweight, scales, zeros)
    want = int4_gemm_torch(x.float(), qweight, scales, zeros)
    assert got.dtype == dtype and not got.isnan().any()
    assert relative_error(got, want) < 1e-2


@pytest.mark.parametrize("m", [1, 16, 256])
def test_gated_kernel_at_the_8b_gate_up(m: int) -> None:
    from nv_kernels.int4_gemm import int4_gemm, int4_gemm_torch

    qweight, scales, zeros = random_int4(2 * 12288, 4096, m)
    x = torch.randn(m, 4096, device="cuda").bfloat16()
    got = int4_gemm(x, qweight, scales, zeros, gated=True)
    assert got.shape == (m, 12288)
    assert relative_error(got, int4_gemm_torch(x, qweight, scales, zeros, gated=True)) < 2e-2


def test_split_k_graph_replay_matches_eager() -> None:
    from nv_kernels.int4_gemm import choose_config, int4_gemm

    n, k = 4096, 12288
    assert choose_config(1, n, k, torch.cuda.get_device_properties(0).multi_processor_count).split_k > 1
    qweight, scales, zeros = random_int4(n, k, 0)
    x = torch.randn(1, k, device="cuda").bfloat16()
    eager = int4_gemm(x, qweight, scales, zeros)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_gemm(x, qweight, scales, zeros)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(out, int4_gemm(x, qweight, scales, zeros), rtol=0, atol=0)
    assert eager.shape == out.shape
