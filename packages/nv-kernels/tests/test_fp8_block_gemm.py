"""Block-FP8 GEMM (nv_kernels.fp8_block_gemm): the Triton kernel under TRITON_INTERPRET=1 equals the
dequantize-then-matmul reference, at a real projection shape and at ragged edges; the quantizer round-trips."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from nv_kernels.fp8_block_gemm import (
    dequantize_fp8_block,
    fp8_block_gemm_torch,
    quantize_activations_torch,
    quantize_fp8_block,
)
from nv_kernels.testing import interpreted_triton_modules

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def kernel() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.fp8_block_gemm_kernel") as (module,):
        yield module


def test_quantizer_round_trip_and_layout() -> None:
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_fp8_block(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (200, 300) and scale.shape == (2, 3)
    assert scale[0, 0] == pytest.approx(float(w[:128, :128].abs().max()) / 448.0)
    back = dequantize_fp8_block(q, scale)
    assert ((back - w).abs() <= w.abs() * 2 ** -4 + scale.max() * 2 ** -9).all()   # e4m3: 3 mantissa bits, RTN


@pytest.mark.parametrize("m,n,k,bias", [(5, 3072, 1024, False), (1, 200, 300, True), (37, 130, 256, False),
                                         (130, 256, 200, False)])
def test_kernel_matches_dequantize_then_matmul(kernel: ModuleType, m: int, n: int, k: int, bias: bool) -> None:
    from nv_kernels.fp8_block_gemm import fp8_block_gemm_triton

    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w_q, scale = quantize_fp8_block(torch.randn(n, k, generator=gen) * 0.05)
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    got = fp8_block_gemm_triton(x, w_q, scale, b).float()
    want = fp8_block_gemm_torch(x.float(), w_q, scale, None if b is None else b.float())
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    exact = x.float() @ dequantize_fp8_block(w_q, scale).T + (0 if b is None else b.float())
    assert (got - exact).abs().max() < 0.1 * exact.abs().max()          # activation rounding only


@pytest.mark.parametrize("m,n,k", [(3, 256, 12288), (20, 128, 4096), (70, 128, 6144)])
def test_kernel_at_the_8b_reduction_lengths(kernel: ModuleType, m: int, n: int, k: int) -> None:
    """Qwen3-8B's K (4096: qkv, o, gate_up; 12288: down; 6144: down's shard at TP 2), 96 activation groups and
    weight block columns summed, at each tile shape (decode, mid-size, prefill rows); N cut to a few column blocks,
    each weight block row with its own scale."""
    from nv_kernels.fp8_block_gemm import fp8_block_gemm_triton

    gen = torch.Generator().manual_seed(k + m)
    x = torch.randn(m, k, generator=gen).bfloat16()
    row_scale = 10.0 ** (2 * torch.rand(n, 1, generator=gen) - 1)
    w_q, scale = quantize_fp8_block(torch.randn(n, k, generator=gen) * k ** -0.5 * row_scale)
    got = fp8_block_gemm_triton(x, w_q, scale).float()
    want = fp8_block_gemm_torch(x.float(), w_q, scale)
    assert ((got - want).norm() / want.norm()).item() < 8e-3               # the output rounded to bf16 once
    exact = x.float() @ dequantize_fp8_block(w_q, scale).T
    assert ((got - exact).norm() / exact.norm()).item() < 0.05              # activation rounding only


def test_activation_rounding_is_per_token_group() -> None:
    x = torch.ones(2, 256)
    x[0, :128] = 1000.0                                                 # a loud group does not mute its neighbour
    assert torch.equal(quantize_activations_torch(x), x)
