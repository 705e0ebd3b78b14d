"""Block-FP8 GEMM (nv_kernels.fp8_block_gemm): the Triton kernels under TRITON_INTERPRET=1 (the activations'
quantization, then the GEMM on FP8 codes) equal the dequantize-then-matmul reference, at a real projection shape,
at ragged edges and at each tile shape; the quantizers round-trip and agree code for code; every launch gives
each SM a program."""
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
    with interpreted_triton_modules("nv_kernels.fp8_act_quant_kernel", "nv_kernels.fp8_block_gemm_kernel") as (
            _, module):
        yield module


def test_quantizer_round_trip_and_layout() -> None:
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_fp8_block(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (200, 300) and scale.shape == (2, 3)
    assert scale[0, 0] == pytest.approx(float(w[:128, :128].abs().max()) / 448.0)
    back = dequantize_fp8_block(q, scale)
    assert ((back - w).abs() <= w.abs() * 2 ** -4 + scale.max() * 2 ** -9).all()   # e4m3: 3 mantissa bits, RTN


@pytest.mark.parametrize("sms", [132, 1])     # an H100's SMs, and one: the widest tiles (128 x 128) at any size
@pytest.mark.parametrize("m,n,k,bias", [(5, 3072, 1024, False), (1, 200, 300, True), (37, 130, 256, False),
                                         (130, 256, 200, False), (300, 200, 256, True), (70, 200, 384, False)])
def test_kernel_matches_dequantize_then_matmul(kernel: ModuleType, m: int, n: int, k: int, bias: bool, sms: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.fp8_block_gemm as fp8_block_gemm
    from nv_kernels.fp8_block_gemm import fp8_block_gemm_triton

    monkeypatch.setattr(fp8_block_gemm, "DEFAULT_SMS", sms)

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


@pytest.mark.parametrize("m,k", [(1, 128), (37, 300), (40, 4096)])
def test_the_activation_kernel_gives_the_reference_codes(kernel: ModuleType, m: int, k: int) -> None:
    from nv_kernels.fp8_block_gemm import quantize_activations_triton

    gen = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=gen).bfloat16() * torch.logspace(-3, 3, m)[:, None].bfloat16()
    x[0, :5] = 0.0                                                      # zeros keep their code
    q, scale = quantize_activations_triton(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (-(-k // 128), m)
    groups = torch.nn.functional.pad(x.float(), (0, -k % 128)).view(m, -1, 128)
    torch.testing.assert_close(scale.T, groups.abs().amax(dim=2) / 448.0, rtol=0, atol=0)
    back = (q.float().view(m, -1) * scale.T.repeat_interleave(128, dim=1)[:, :k])
    assert torch.equal(back, quantize_activations_torch(x))


def test_every_launch_gives_each_sm_a_program() -> None:
    from nv_kernels.fp8_block_gemm import tile_shape

    for m in (1, 16, 17, 48, 64, 65, 256, 512, 8192):
        for n in (1024, 4096, 6144, 24576):
            block_m, block_n, _, _ = tile_shape(m, n, 132)
            assert 128 % block_n == 0 and block_m >= min(m, 64)        # one scale row per tile; rows in one tile
            if block_n > 32:
                assert -(-m // block_m) * -(-n // block_n) >= 0.7 * 132
    assert tile_shape(8192, 6144, 132)[:2] == (128, 128)                # prefill: the widest tiles
    assert tile_shape(256, 4096, 132)[:2] == (64, 128)                  # decode batch 256: 128 programs, not 64
    assert tile_shape(256, 6144, 132)[:2] == (128, 128)                 # 96 programs of the widest tiles


def test_activation_rounding_is_per_token_group() -> None:
    x = torch.ones(2, 256)
    x[0, :128] = 1000.0                                                 # a loud group does not mute its neighbour
    assert torch.equal(quantize_activations_torch(x), x)
