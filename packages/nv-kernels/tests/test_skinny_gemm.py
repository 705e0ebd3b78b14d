"""The skinny GEMM (nv_kernels.skinny_gemm) against torch: interpreted on CPU at tiny shapes (plain, split-K,
masked K tails, bias, the gated SiLU-and-mul epilogue, both inner products), the dispatch condition, and
compiled on the GPU at the Qwen3-0.6B / 8B projection shapes for M = 1..16 (pytest -m gpu).

Errors are relative (||out - ref|| / ||ref||) against torch in fp32 on the same bf16 / fp16 inputs; the
kernel rounds where the model-dtype torch path rounds (GEMM output, silu, product), so it also stays
within a few ulps of that path.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels.fused_dispatch import fused_ops
from nv_kernels.skinny_gemm import (
    MAX_M,
    SkinnyGemmConfig,
    choose_config,
    heuristic_config,
    set_skinny_gemm,
    skinny_gemm_applies,
    skinny_gemm_torch,
)
from nv_kernels.testing import interpreted_triton_modules, relative_error

PLAIN_TOL = 8e-3    # the output rounded to bf16 once (2^-9 relative) with margin
GATED_TOL = 2e-2    # gate, up, silu and the product each rounded to bf16


def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full(*args, fill_value=float("nan"), **kwargs)


def operands(m: int, k: int, rows: int, dtype: torch.dtype, bias: bool, device: str = "cpu", seed: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device).to(dtype)                    # [M, K]
    w = (torch.randn(rows, k, generator=gen, device=device) * k ** -0.5).to(dtype)   # [N_w, K]
    b = torch.randn(rows, generator=gen, device=device).to(dtype) if bias else None  # [N_w]
    return x, w, b


def check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, gated: bool) -> None:
    rows = w.shape[0] // 2 if gated else w.shape[0]
    assert out.shape == (*x.shape[:-1], rows) and out.dtype == x.dtype
    assert bool(torch.isfinite(out).all())
    ref32 = skinny_gemm_torch(x.float(), w.float(), None if b is None else b.float(), gated=gated)
    assert relative_error(out, ref32) < (GATED_TOL if gated else PLAIN_TOL)
    same_dtype = skinny_gemm_torch(x, w, b, gated=gated)      # torch's path in the model dtype
    assert relative_error(out, same_dtype) < (GATED_TOL if gated else PLAIN_TOL)


@pytest.fixture(scope="module")
def interp() -> Iterator[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    with interpreted_triton_modules("nv_kernels.skinny_gemm") as (module,):
        yield module


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs and split-K partial sums start as NaN: a column or split the kernels skip shows up."""
    monkeypatch.setattr(interp, "_empty", nan_empty)


@pytest.mark.parametrize("m,k,rows,bias", [(1, 64, 32, False), (3, 128, 96, True), (16, 96, 48, False)])
def test_plain_default_config(interp: ModuleType, poisoned: None, m: int, k: int, rows: int, bias: bool) -> None:
    x, w, b = operands(m, k, rows, torch.bfloat16, bias, seed=m)
    x0, w0 = x.clone(), w.clone()
    check(interp.skinny_gemm(x, w, b), x, w, b, gated=False)
    assert torch.equal(x, x0) and torch.equal(w, w0)


# Split-K over 2 or 3 programs per column block, K tails that are not whole blocks, both inner products.
SPLIT_CASES = [
    (2, 96, 40, SkinnyGemmConfig(block_n=16, block_k=32, split_k=2, use_dot=False)),  # N tail, M_PAD 2
    (5, 100, 64, SkinnyGemmConfig(block_n=16, block_k=32, split_k=3, use_dot=True)),  # K tail in the last split
    (1, 128, 48, SkinnyGemmConfig(block_n=32, block_k=16, split_k=4, use_dot=False)),
]


@pytest.mark.parametrize("m,k,rows,config", SPLIT_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_split_k(interp: ModuleType, poisoned: None, m: int, k: int, rows: int, config: SkinnyGemmConfig,
                 bias: bool) -> None:
    x, w, b = operands(m, k, rows, torch.bfloat16, bias, seed=k)
    check(interp.skinny_gemm(x, w, b, config=config), x, w, b, gated=False)


@pytest.mark.parametrize("m,k,rows,bias,config", [
    (1, 64, 64, False, SkinnyGemmConfig(block_n=16, block_k=32, use_dot=False)),   # the GEMV, two K steps
    (3, 128, 96, True, None),
    (16, 64, 64, True, SkinnyGemmConfig(block_n=16, block_k=16, split_k=2, use_dot=True)),
    (3, 80, 48, False, SkinnyGemmConfig(block_n=16, block_k=32, split_k=2, use_dot=False)),
])
def test_gated_silu_and_mul(interp: ModuleType, poisoned: None, m: int, k: int, rows: int, bias: bool,
                            config: SkinnyGemmConfig | None) -> None:
    x, w, b = operands(m, k, rows, torch.bfloat16, bias, seed=rows)
    check(interp.skinny_gemm(x, w, b, gated=True, config=config), x, w, b, gated=True)


def test_fp16_and_leading_dims(interp: ModuleType, poisoned: None) -> None:
    x, w, b = operands(6, 64, 32, torch.float16, True, seed=7)
    x3 = x.view(2, 3, 64)                                                  # [2, 3, K]: 6 rows
    out = interp.skinny_gemm(x3, w, b)
    assert out.shape == (2, 3, 32)
    check(out.view(6, 32), x, w, b, gated=False)
    for cfg in (SkinnyGemmConfig(use_dot=False), SkinnyGemmConfig(use_dot=True)):   # one answer either way
        assert relative_error(interp.skinny_gemm(x, w, b, config=cfg), out.view(6, 32)) < 2e-3


def test_rejects_what_it_cannot_compute(interp: ModuleType) -> None:
    x, w, b = operands(MAX_M + 1, 32, 16, torch.bfloat16, True)
    assert b is not None
    with pytest.raises(ValueError, match="at most 16 rows"):
        interp.skinny_gemm(x, w)
    with pytest.raises(ValueError, match="bf16 / fp16"):
        interp.skinny_gemm(x[:2].float(), w.float())
    with pytest.raises(ValueError, match="does not match"):
        interp.skinny_gemm(x[:2, :16], w)
    with pytest.raises(ValueError, match="rows must be even"):
        interp.skinny_gemm(x[:2], w[:15], gated=True)
    with pytest.raises(ValueError, match="bias must be"):
        interp.skinny_gemm(x[:2], w, b[:8])
    with pytest.raises(ValueError, match="power of two"):
        SkinnyGemmConfig(block_n=24, use_dot=False)
    with pytest.raises(ValueError, match="at least 16"):
        SkinnyGemmConfig(block_n=8, use_dot=True)
    assert interp.skinny_gemm(x[:0], w).shape == (0, 16)


def test_heuristic_covers_the_machine_and_tuned_configs_win(monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.skinny_gemm as skinny

    sms = skinny.DEFAULT_NUM_SMS
    # 0.6B down (N 1024, K 3072) and o (N 1024, K 2048): 64 column blocks of 16, so K is split.
    for k in (3072, 2048):
        cfg = heuristic_config(1024, k, 1, gated=False, num_sms=sms)
        assert cfg.split_k > 1 and (1024 // cfg.block_n) * cfg.split_k >= sms
        assert k // cfg.split_k >= 2 * cfg.block_k                       # each split keeps two K steps
    gate_up = heuristic_config(2 * 12288, 4096, 16, gated=True, num_sms=sms)   # 8B gate_up: columns suffice
    assert gate_up.split_k == 1 and gate_up.block_n == 32 and gate_up.use_dot
    assert not heuristic_config(4096, 1024, 1, gated=False, num_sms=sms).use_dot   # M = 1: the CUDA-core GEMV
    tuned = SkinnyGemmConfig(block_n=64, block_k=128, split_k=2, num_warps=8)
    monkeypatch.setitem(skinny.TUNED_CONFIGS, (4096, 1024, 4, False), tuned)
    monkeypatch.delitem(skinny.TUNED_CONFIGS, (4096, 1024, 8, False), raising=False)
    assert choose_config(4096, 1024, 3, gated=False) is tuned              # M 3 is in the bucket of 4
    assert choose_config(4096, 1024, 8, gated=False) is not tuned


def test_a_shape_where_torch_measured_faster_keeps_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.skinny_gemm as skinny

    x, w, _ = operands(4, 32, 16, torch.bfloat16, False)
    with fused_ops("on"):
        monkeypatch.setitem(skinny.TUNED_CONFIGS, (16, 32, 4, False), SkinnyGemmConfig())
        assert skinny_gemm_applies(x, w)
        monkeypatch.setitem(skinny.TUNED_CONFIGS, (16, 32, 4, False), None)
        assert not skinny_gemm_applies(x, w)


def test_dispatch_condition() -> None:
    x, w, b = operands(MAX_M, 32, 16, torch.bfloat16, True)
    assert b is not None
    with fused_ops("auto"):
        assert not skinny_gemm_applies(x, w, b) or torch.cuda.is_available()   # CPU: torch unless forced
    with fused_ops("off"):
        assert not skinny_gemm_applies(x, w, b)
    with fused_ops("on"), pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        assert skinny_gemm_applies(x, w, b) and skinny_gemm_applies(x[:1], w)
        assert not skinny_gemm_applies(torch.cat([x, x[:1]]), w, b)              # 17 tokens: cuBLAS
        assert not skinny_gemm_applies(x[:0], w)
        assert not skinny_gemm_applies(x.float(), w.float())                     # fp32 models: cuBLAS
        assert not skinny_gemm_applies(x, w.half())
        assert not skinny_gemm_applies(x, w, b.float())
        previous = set_skinny_gemm(False)
        try:
            assert not skinny_gemm_applies(x, w, b)                              # the A/B switch
        finally:
            set_skinny_gemm(previous)


# Qwen3-0.6B and Qwen3-8B projections: (weight rows N_w, K, gated).
GPU_SHAPES = [(4096, 1024, False), (1024, 2048, False), (6144, 1024, True), (1024, 3072, False),
              (6144, 4096, False), (4096, 4096, False), (24576, 4096, True), (4096, 12288, False)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,k,gated", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_real_shapes(monkeypatch: pytest.MonkeyPatch, rows: int, k: int, gated: bool, dtype: torch.dtype
                         ) -> None:
    from nv_kernels import skinny_gemm as skinny

    monkeypatch.setattr(skinny, "_empty", nan_empty)
    for m in range(1, MAX_M + 1):
        x, w, b = operands(m, k, rows, dtype, bias=m % 4 == 0, device="cuda", seed=m)
        check(skinny.skinny_gemm(x, w, b, gated=gated), x, w, b, gated)
        for cfg in (SkinnyGemmConfig(split_k=4, use_dot=m > 2), SkinnyGemmConfig(block_n=64, block_k=128)):
            check(skinny.skinny_gemm(x, w, b, gated=gated, config=cfg), x, w, b, gated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,k,gated", [(6144, 1024, True), (1024, 3072, False)], ids=str)
def test_gpu_cuda_graph_replays_with_new_inputs(rows: int, k: int, gated: bool) -> None:
    """Captured once (split-K partials included), replayed on new x: the eager result each time."""
    from nv_kernels import skinny_gemm as skinny

    for m in (1, 16):
        x, w, b = operands(m, k, rows, torch.bfloat16, bias=True, device="cuda", seed=m)
        skinny.skinny_gemm(x, w, b, gated=gated)                          # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = skinny.skinny_gemm(x, w, b, gated=gated)
        for seed in (1, 2):
            x.copy_(operands(m, k, rows, torch.bfloat16, bias=False, device="cuda", seed=100 + seed)[0])
            graph.replay()
            assert torch.equal(out, skinny.skinny_gemm(x, w, b, gated=gated))
