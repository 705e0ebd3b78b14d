"""INT4 GEMM (nv_kernels.int4_gemm): the Triton kernel under TRITON_INTERPRET=1 equals the dequantize-then-matmul
reference at a real projection shape (tensor-core tiles with split K, the one-row GEMV, and the pair-dequantizing
launch for up to 16 rows of bf16 / fp16 x) and at ragged edges, and with SiLU-and-mul fused (gated);
every output element is written; the split-K counters are left at 0; the kernel layout and the round-to-nearest
quantizer keep what they promise."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

import nv_kernels.int4_gemm as int4_gemm
from nv_kernels.int4_gemm import (
    Int4GemmConfig,
    choose_config,
    dequantize_int4,
    dequantize_int4_canonical,
    int4_gemm_torch,
    pack_int4_weight,
    quantize_int4,
    unpack_int4_codes,
)
from nv_kernels.testing import interpreted_triton_modules, relative_error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def kernel() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.int4_gemm_kernel") as (module,):
        yield module


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs start as NaN: an element the kernel does not write shows."""
    def empty(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(int4_gemm, "_empty", empty)


def random_int4(n: int, k: int, gen: torch.Generator, scale_dtype: torch.dtype = torch.float16
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random codes and zeros (zeros up to 16, as an older GPTQ checkpoint's may be), scales of `scale_dtype`,
    in the kernel layout."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = torch.randint(0, 17, (n, k // 128), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // 128, generator=gen) * 0.02 + 0.001).to(scale_dtype)
    return pack_int4_weight(codes, scales, zeros)


def test_kernel_layout_and_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 256), generator=gen, dtype=torch.uint8)
    scales, zeros = torch.rand(3, 2).half(), torch.randint(0, 16, (3, 2), dtype=torch.uint8)
    qweight, scales_t, zeros_t = pack_int4_weight(codes, scales, zeros)
    assert qweight.dtype == torch.int32 and qweight.shape == (3, 32)
    assert scales_t.shape == zeros_t.shape == (2, 3) and torch.equal(scales_t, scales.t())
    # word j of group g holds k = 128 g + 16 i + j at bits 4 i
    word = int(qweight[1, 16 + 5]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [int(codes[1, 128 + 16 * i + 5]) for i in range(8)]
    assert torch.equal(unpack_int4_codes(qweight), codes)
    want = (codes.float() - zeros.float().repeat_interleave(128, 1)) * scales.float().repeat_interleave(128, 1)
    assert torch.equal(dequantize_int4(qweight, scales_t, zeros_t), want)


def test_round_to_nearest_quantizer() -> None:
    w = torch.randn(64, 384, generator=torch.Generator().manual_seed(1))
    codes, scales, zeros = quantize_int4(w)
    assert codes.dtype == zeros.dtype == torch.uint8 and scales.dtype == torch.float16
    assert int(codes.max()) <= 15 and scales.shape == zeros.shape == (64, 3)
    back = dequantize_int4_canonical(codes, scales, zeros)
    step = scales.float().repeat_interleave(128, 1)
    assert ((back - w).abs() <= 0.5 * step + 1e-3 * step).all()          # half a step, but where a group clamps
    with pytest.raises(ValueError, match="groups of 128"):
        quantize_int4(torch.zeros(4, 100))


@pytest.mark.parametrize("m,n,k,bias", [(5, 1024, 4096, False), (1, 1024, 3072, True), (37, 130, 384, True),
                                         (130, 96, 256, False)])
def test_kernel_matches_dequantize_then_matmul(kernel: ModuleType, poisoned_outputs: None, m: int, n: int, k: int,
                                               bias: bool) -> None:
    from nv_kernels.int4_gemm import int4_gemm_triton

    gen = torch.Generator().manual_seed(m * n + k)
    qweight, scales, zeros = random_int4(n, k, gen)
    x = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    got = int4_gemm_triton(x, qweight, scales, zeros, b)
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    want = int4_gemm_torch(x.float(), qweight, scales, zeros, None if b is None else b.float())
    assert relative_error(got, want) < 5e-3                              # the bf16 rounding of the output
    assert int(int4_gemm.WORKSPACE.counters(torch.device("cpu"), 1).abs().sum()) == 0


@pytest.mark.parametrize("config", [Int4GemmConfig(16, 32, True, 3, 4, 1), Int4GemmConfig(1, 16, False, 2, 4, 1),
                                    Int4GemmConfig(16, 16, True, 1, 4, 1), Int4GemmConfig(16, 32, True, 2, 4, 1, True),
                                    Int4GemmConfig(8, 64, True, 1, 4, 1, True)])
def test_each_variant_with_fp32_scales_and_fp16_activations(kernel: ModuleType, poisoned_outputs: None,
                                                            config: Int4GemmConfig) -> None:
    from nv_kernels.int4_gemm import int4_gemm_triton

    gen = torch.Generator().manual_seed(7)
    qweight, scales, zeros = random_int4(80, 512, gen, torch.float32)
    m = config.block_m if config.use_dot else 1
    x = torch.randn(m, 512, generator=gen).half()
    got = int4_gemm_triton(x, qweight, scales, zeros, config=config)
    want = int4_gemm_torch(x.float(), qweight, scales, zeros)
    assert relative_error(got, want) < 2e-3


@pytest.mark.parametrize("m,config", [(1, None), (6, None), (40, None), (1, Int4GemmConfig(1, 16, False, 1, 4, 1))])
def test_gated_kernel_matches_gemm_then_silu_and_mul(kernel: ModuleType, poisoned_outputs: None, m: int,
                                                     config: Int4GemmConfig | None) -> None:
    """[gate; up] weights (2 x 192 rows, K = 512): the split-K GEMV and tile paths, no split, a bias."""
    from nv_kernels.int4_gemm import int4_gemm_triton

    gen = torch.Generator().manual_seed(m)
    qweight, scales, zeros = random_int4(2 * 192, 512, gen)
    x = torch.randn(m, 512, generator=gen).bfloat16()
    bias = torch.randn(2 * 192, generator=gen).bfloat16()
    got = int4_gemm_triton(x, qweight, scales, zeros, bias, config=config, gated=True)
    assert got.shape == (m, 192) and not got.isnan().any()
    want = int4_gemm_torch(x, qweight, scales, zeros, bias, gated=True)
    assert relative_error(got, want) < 2e-2                 # three bf16 roundings (gate, silu, product), as skinny's
    exact = int4_gemm_triton(x.float(), qweight, scales, zeros, bias.float(), config=config, gated=True)
    assert relative_error(exact, int4_gemm_torch(x.float(), qweight, scales, zeros, bias.float(), gated=True)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pair_dequantization_constants_are_exact(dtype: torch.dtype) -> None:
    """The pairs launch's PTX (which the interpreter does not run): for every code and zero point, the 16-bit
    float with the code OR-ed into its bias constant, plus the float the kernel makes of -(bias + zero), is
    code - zero exactly, and the fma's multiplier is 1.0, in both halves of the pair."""
    import re

    import nv_kernels.int4_gemm_kernel as kernel_module

    bf16 = dtype == torch.bfloat16
    asm = (kernel_module.PAIR_ASM_BF16 if bf16 else kernel_module.PAIR_ASM_F16).value
    one, magic = (int(v, 16) for v in re.search(r"mov.b32 one, (0x\w+);.*0x000F000F, (0x\w+),", asm).groups())
    neg_base = (kernel_module.NEG_BIAS_BF16 if bf16 else kernel_module.NEG_BIAS_F16).value

    def as_float(bits: list[int]) -> torch.Tensor:
        return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(dtype).float()

    codes, zeros = torch.arange(16), torch.arange(17)
    for half in (0, 16):
        biased = as_float([((magic >> half) & 0xFFFF) | c for c in range(16)])               # [16]
        neg = as_float([neg_base + z for z in range(17)])                                      # [17]
        got = biased[:, None] * as_float([(one >> half) & 0xFFFF]) + neg[None, :]
        assert torch.equal(got, (codes[:, None] - zeros[None, :]).float())


def test_pairs_launch_needs_16_bit_x_in_one_row_block(kernel: ModuleType) -> None:
    """fp32 x takes the other launches by itself; asked for the pairs launch outright it is a ValueError, as are
    more rows than the pairs block holds."""
    from nv_kernels.int4_gemm import int4_gemm_triton

    gen = torch.Generator().manual_seed(3)
    qweight, scales, zeros = random_int4(64, 256, gen)
    x = torch.randn(3, 256, generator=gen)
    want = int4_gemm_torch(x, qweight, scales, zeros)
    assert relative_error(int4_gemm_triton(x, qweight, scales, zeros), want) < 1e-5
    with pytest.raises(ValueError, match="pairs"):
        int4_gemm_triton(x, qweight, scales, zeros, config=Int4GemmConfig(8, 64, True, 1, 4, 1, True))
    with pytest.raises(ValueError, match="pairs"):
        int4_gemm_triton(torch.randn(12, 256).bfloat16(), qweight, scales, zeros,
                         config=Int4GemmConfig(8, 64, True, 1, 4, 1, True))


def test_launch_choices() -> None:
    one_row = choose_config(1, 4096, 4096, 132)
    assert one_row.pairs and one_row.use_dot and one_row.block_m == 8 and one_row.split_k > 1
    assert choose_config(8, 4096, 4096, 132).pairs and not choose_config(9, 4096, 4096, 132).pairs
    assert not choose_config(1, 12288, 4096, 132, gated=True).pairs         # gate_up at one row: the GEMV
    assert choose_config(9, 4096, 4096, 132)[:3] == (16, 64, True)
    fp32_row = choose_config(1, 4096, 4096, 132, pairs=False)              # x in fp32: the GEMV
    assert not fp32_row.use_dot and fp32_row.block_m == 1 and fp32_row.split_k > 1
    assert choose_config(16, 4096, 4096, 132, pairs=False).use_dot
    assert choose_config(48, 4096, 4096, 132).split_k > 1                 # one row block: split to fill the GPU
    assert choose_config(256, 12288, 4096, 132)[:2] == (128, 128)
    assert choose_config(256, 4096, 4096, 132)[:2] == (128, 64)           # 2 x 32 tiles of 128 would leave SMs idle
    assert choose_config(256, 4096, 4096, 132).split_k == 1
    wide = choose_config(1, 24576, 4096, 132)
    assert wide.split_k <= 4                                         # enough column blocks already
    for m, n, k in [(1, 4096, 12288), (7, 6144, 4096), (16, 1024, 256), (64, 4096, 4096)]:
        cfg = choose_config(m, n, k, 132)
        groups = k // 128
        assert 1 <= cfg.split_k <= groups and -(-groups // -(-groups // cfg.split_k)) == cfg.split_k
