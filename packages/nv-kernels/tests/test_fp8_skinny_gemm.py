"""The FP8-weight skinny GEMM (nv_kernels.fp8_skinny_gemm, W8A16) against dequantize-then-matmul: interpreted on
CPU at a real projection shape (K 4096, N 1024; M 1, 3, 16) and at odd shapes (N and K tails, scale-block rows that
a tile must not straddle, split-K reduced by the last split, the one-tile path, the gated SiLU-and-mul epilogue,
both inner products, fp16), the configuration rules and the dispatch condition; compiled on the GPU at the
Qwen3-8B projection shapes for M 1, 4, 16 (pytest -m gpu).

Errors are relative (||out - ref|| / ||ref||) against the reference in fp32 on the same inputs (x in the model
dtype, the weight dequantized to fp32): the kernel accumulates in fp32 and rounds where torch's path does.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels.fp8_block_gemm import quantize_fp8_block
from nv_kernels.fp8_skinny_gemm_config import FP8_TUNED_CONFIGS, choose_fp8_config, fit_to_scale_blocks
from nv_kernels.fused_dispatch import fused_ops
from nv_kernels.skinny_gemm_config import TUNED_CONFIGS, SkinnyGemmConfig
from nv_kernels.split_k_workspace import SplitKWorkspace
from nv_kernels.testing import interpreted_triton_modules, relative_error

PLAIN_TOL = 8e-3    # the output rounded to the model dtype once, with margin
GATED_TOL = 2e-2    # gate, up, silu and the product each rounded
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full(*args, fill_value=float("nan"), **kwargs)


def operands(m: int, k: int, rows: int, dtype: torch.dtype, bias: bool, device: str = "cpu", seed: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [M, K], w_q e4m3 [N_w, K] with scales [ceil(N_w/128), ceil(K/128)], bias [N_w]. The weight's rows get
    scales a thousand-fold apart, so a tile read with its neighbour block's scale is far off."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device).to(dtype)                               # [M, K]
    row_scale = 10.0 ** (3 * torch.rand(rows, 1, generator=gen, device=device) - 1.5)          # [N_w, 1]
    col_scale = 10.0 ** (torch.rand(1, k, generator=gen, device=device) - 0.5)                 # [1, K]
    w = torch.randn(rows, k, generator=gen, device=device) * k ** -0.5 * row_scale * col_scale
    w_q, scale = quantize_fp8_block(w)
    b = torch.randn(rows, generator=gen, device=device).to(dtype) if bias else None            # [N_w]
    return x, w_q, scale, b


@pytest.fixture(scope="module")
def interp() -> Iterator[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    with interpreted_triton_modules("nv_kernels.skinny_gemm_kernel", "nv_kernels.fp8_skinny_gemm_kernel",
                                    "nv_kernels.fp8_skinny_gemm") as (_, _, module):
        yield module


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> SplitKWorkspace:
    """Outputs and split-K partial sums start as NaN: a column or split the kernel skips shows up."""
    monkeypatch.setattr(interp, "_empty", nan_empty)
    workspace = SplitKWorkspace()
    workspace.partials(torch.device("cpu"), 1 << 18).fill_(float("nan"))
    monkeypatch.setattr(interp, "WORKSPACE", workspace)
    return workspace


def check(interp: ModuleType, out: torch.Tensor, x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor,
          b: torch.Tensor | None, gated: bool) -> None:
    rows = w_q.shape[0] // 2 if gated else w_q.shape[0]
    assert out.shape == (*x.shape[:-1], rows) and out.dtype == x.dtype
    assert bool(torch.isfinite(out).all())
    ref = interp.fp8_skinny_gemm_torch(x.float(), w_q, scale, None if b is None else b.float(), gated=gated)
    assert relative_error(out, ref) < (GATED_TOL if gated else PLAIN_TOL)


# the kinds of configuration the layers choose at this size (one K tile per program for the GEMV of one row; split-K
# and tl.dot above), in tiles wide enough that the interpreter runs few programs
REAL_SHAPE_CONFIGS = {1: SkinnyGemmConfig(block_n=32, block_k=4096, split_k=1, num_stages=1, use_dot=False),
                      3: SkinnyGemmConfig(block_n=64, block_k=512, split_k=2, use_dot=True),
                      16: SkinnyGemmConfig(block_n=64, block_k=512, split_k=2, use_dot=True)}


@pytest.mark.parametrize("m", [1, 3, 16])
def test_a_real_projection_shape(interp: ModuleType, poisoned: SplitKWorkspace, m: int) -> None:
    """K 4096 -> N 1024: 32 scale blocks along K, 8 along N, each with its own scale."""
    x, w_q, scale, b = operands(m, 4096, 1024, torch.bfloat16, bias=m == 3, seed=m)
    x0 = x.clone()
    out = interp.fp8_skinny_gemm(x, w_q, scale, b, config=REAL_SHAPE_CONFIGS[m])
    check(interp, out, x, w_q, scale, b, gated=False)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("m,config", [(1, SkinnyGemmConfig(block_n=32, block_k=512, split_k=2, use_dot=False)),
                                      (16, SkinnyGemmConfig(block_n=32, block_k=128, split_k=2, use_dot=True))])
def test_the_8b_down_reduction_length(interp: ModuleType, poisoned: SplitKWorkspace, m: int,
                                      config: SkinnyGemmConfig) -> None:
    """K 12288 (Qwen3-8B's down: 96 scale blocks along K) in down's kinds of configuration, N cut to 256."""
    x, w_q, scale, _ = operands(m, 12288, 256, torch.bfloat16, bias=False, seed=12288 + m)
    check(interp, interp.fp8_skinny_gemm(x, w_q, scale, config=config), x, w_q, scale, None, gated=False)


# (m, k, rows, gated, config): N tails (200, 130 rows), scale rows cut at 128 inside the grid, K tails, split-K over
# 2-3 programs, one K tile per program (k_per_split == block_k), both inner products, gated with an up offset that
# is not a multiple of 128 (96 columns: tiles narrowed to 32 so none straddles a scale row).
ODD_CASES = [
    (2, 200, 130, False, SkinnyGemmConfig(block_n=32, block_k=64, split_k=2, use_dot=False)),
    (1, 300, 200, False, SkinnyGemmConfig(block_n=64, block_k=512, split_k=1, use_dot=False)),   # one tile
    (5, 300, 256, False, SkinnyGemmConfig(block_n=16, block_k=64, split_k=3, use_dot=True)),
    (1, 384, 192, True, SkinnyGemmConfig(block_n=64, block_k=128, split_k=3, use_dot=False)),    # one tile, split
    (3, 260, 256, True, SkinnyGemmConfig(block_n=16, block_k=64, split_k=2, use_dot=True)),
    (4, 96, 512, False, SkinnyGemmConfig(block_n=256, block_k=32, split_k=1, use_dot=False)),    # block_n > 128
]


@pytest.mark.parametrize("m,k,rows,gated,config", ODD_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_odd_shapes(interp: ModuleType, poisoned: SplitKWorkspace, m: int, k: int, rows: int, gated: bool,
                    config: SkinnyGemmConfig, bias: bool) -> None:
    x, w_q, scale, b = operands(m, k, rows, torch.bfloat16, bias, seed=k + rows)
    out = interp.fp8_skinny_gemm(x, w_q, scale, b, gated=gated, config=config)
    check(interp, out, x, w_q, scale, b, gated)
    counters = poisoned.counters(torch.device("cpu"), 1)
    assert not bool(counters.any())                                        # back at 0 for the next call
    assert torch.equal(interp.fp8_skinny_gemm(x, w_q, scale, b, gated=gated, config=config), out)   # split order


def test_gated_up_offset_off_the_scale_grid(interp: ModuleType, poisoned: SplitKWorkspace) -> None:
    """96 gate and 96 up rows: the up half starts inside scale row 0, so 32-row tiles are the widest that fit."""
    x, w_q, scale, b = operands(2, 256, 192, torch.bfloat16, bias=False, seed=5)
    wide = SkinnyGemmConfig(block_n=64, block_k=128, split_k=1, use_dot=False)
    assert fit_to_scale_blocks(wide, 96, gated=True).block_n == 32
    check(interp, interp.fp8_skinny_gemm(x, w_q, scale, gated=True, config=wide), x, w_q, scale, None, gated=True)


def test_fp16_and_leading_dims(interp: ModuleType, poisoned: SplitKWorkspace) -> None:
    x, w_q, scale, b = operands(6, 128, 64, torch.float16, bias=True, seed=7)
    out = interp.fp8_skinny_gemm(x.view(2, 3, 128), w_q, scale, b)
    assert out.shape == (2, 3, 64)
    check(interp, out.view(6, 64), x, w_q, scale, b, gated=False)


def test_rejects_what_it_cannot_compute(interp: ModuleType) -> None:
    x, w_q, scale, b = operands(17, 128, 64, torch.bfloat16, bias=True)
    assert b is not None
    with pytest.raises(ValueError, match="at most 16 rows"):
        interp.fp8_skinny_gemm(x, w_q, scale)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        interp.fp8_skinny_gemm(x[:2], w_q.bfloat16(), scale)
    with pytest.raises(ValueError, match="does not match"):
        interp.fp8_skinny_gemm(x[:2, :64], w_q, scale)
    with pytest.raises(ValueError, match="scale_inv must be"):
        interp.fp8_skinny_gemm(x[:2], w_q, scale[:, :0])
    with pytest.raises(ValueError, match="rows must be even"):
        interp.fp8_skinny_gemm(x[:2], w_q[:63], scale, gated=True)
    with pytest.raises(ValueError, match="bias must be"):
        interp.fp8_skinny_gemm(x[:2], w_q, scale, b[:8])
    assert interp.fp8_skinny_gemm(x[:0], w_q, scale).shape == (0, 64)


def test_configurations_fit_the_scale_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes without a measured FP8 entry: one row from the bf16 choice, more on the tensor cores with 128-row
    weight tiles and one scale block per K step, split until the SMs are covered; all within one scale row. A
    measured FP8 entry wins, fitted to the scale blocks as well."""
    import nv_kernels.fp8_skinny_gemm_config as fp8_config

    shapes = [(6144, 4096, False), (4096, 4096, False), (24576, 4096, True), (4096, 12288, False)]   # Qwen3-8B
    measured = {(rows, k, m, gated): choose_fp8_config(rows, k, m, gated) for rows, k, gated in shapes
                for m in (1, 4, 16)}
    assert all(cfg == FP8_TUNED_CONFIGS[key] for key, cfg in measured.items() if key in FP8_TUNED_CONFIGS)
    qkv16 = measured[(6144, 4096, 16, False)]
    assert qkv16.use_dot and (qkv16.block_n, qkv16.block_k, qkv16.num_warps) == (128, 128, 4)
    assert -(-6144 // 128) * qkv16.split_k >= 132 and 4096 // 128 // qkv16.split_k >= 2
    monkeypatch.setattr(fp8_config, "FP8_TUNED_CONFIGS", {})
    for rows, k, gated in shapes:
        for m in (1, 4, 16):
            for cfg in (choose_fp8_config(rows, k, m, gated), measured[(rows, k, m, gated)]):
                assert 128 % cfg.block_n == 0 and (not gated or (rows // 2) % cfg.block_n == 0)
                assert cfg.use_dot == (m > 1)
            derived = choose_fp8_config(rows, k, m, gated)
            assert not derived.use_dot or derived.block_k <= 128
    assert choose_fp8_config(4096, 4096, 1, False) == TUNED_CONFIGS[(4096, 4096, 1, False)]   # M 1: as bf16
    monkeypatch.undo()
    narrow = fit_to_scale_blocks(SkinnyGemmConfig(block_n=64, use_dot=True), 40, gated=True)
    assert narrow.block_n == 8 and not narrow.use_dot                     # tl.dot needs 16 columns
    tuned = SkinnyGemmConfig(block_n=16, block_k=128, split_k=4, num_warps=8)
    monkeypatch.setitem(FP8_TUNED_CONFIGS, (4096, 12288, 4, False), tuned)
    assert choose_fp8_config(4096, 12288, 3, False) is tuned               # M 3 is in the bucket of 4
    wide = SkinnyGemmConfig(block_n=16, block_k=512, split_k=4, num_warps=8)
    assert fit_to_scale_blocks(wide, 4096, gated=False).block_k == 128    # tensor cores: a scale block a step


def test_dispatch_condition(interp: ModuleType) -> None:
    from nv_kernels.skinny_gemm import set_skinny_gemm

    x, w_q, scale, b = operands(4, 128, 64, torch.bfloat16, bias=True)
    assert not interp.fp8_skinny_gemm_applies(x, w_q, scale, b)            # CPU tensors: fused ops are off
    with fused_ops("on"):
        assert interp.fp8_skinny_gemm_applies(x, w_q, scale, b)
        assert interp.fp8_skinny_gemm_applies(x[:1], w_q, scale)
        assert not interp.fp8_skinny_gemm_applies(torch.cat([x] * 5), w_q, scale)     # 20 rows: W8A8 GEMM
        assert not interp.fp8_skinny_gemm_applies(x.float(), w_q, scale)
        assert not interp.fp8_skinny_gemm_applies(x, w_q, scale[:, :0])
        assert not interp.fp8_skinny_gemm_applies(x, w_q, scale, b.float())   # pyright: ignore[reportOptionalMemberAccess]
        previous = set_skinny_gemm(False)
        try:
            assert not interp.fp8_skinny_gemm_applies(x, w_q, scale)
        finally:
            set_skinny_gemm(previous)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("rows,k,gated", [(6144, 4096, False), (4096, 4096, False), (24576, 4096, True),
                                          (4096, 12288, False)])   # Qwen3-8B: qkv, o, gate_up, down
def test_gpu_qwen3_8b_shapes(m: int, rows: int, k: int, gated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.fp8_skinny_gemm as fp8_skinny

    monkeypatch.setattr(fp8_skinny, "_empty", lambda *a, **kw: torch.full(*a, fill_value=float("nan"), **kw))
    x, w_q, scale, b = operands(m, k, rows, torch.bfloat16, bias=False, device="cuda", seed=m + rows)
    ref = fp8_skinny.fp8_skinny_gemm_torch(x.float(), w_q, scale, gated=gated)
    for _ in range(2):                                   # the second call reuses the split-K counters
        out = fp8_skinny.fp8_skinny_gemm(x, w_q, scale, gated=gated)
        assert bool(torch.isfinite(out).all())
        assert relative_error(out, ref) < (GATED_TOL if gated else PLAIN_TOL)
