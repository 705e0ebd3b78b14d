"""The skinny GEMM (nv_kernels.skinny_gemm) against torch: interpreted on CPU at tiny shapes (plain, split-K
reduced by the last split of each column block, masked K tails, bias, the gated SiLU-and-mul epilogue, both
inner products, add + RMSNorm fused into the prologue), the dispatch condition, and compiled on the GPU at the
Qwen3-0.6B / 8B projection shapes for M = 1..16 (pytest -m gpu).

Errors are relative (||out - ref|| / ||ref||) against torch in fp32 on the same bf16 / fp16 inputs; the
kernel rounds where the model-dtype torch path rounds (GEMM output, silu, product), so it also stays
within a few ulps of that path.
"""
from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels.fused_dispatch import fused_ops
from nv_kernels.skinny_gemm import (
    MAX_M,
    set_skinny_gemm,
    skinny_gemm_applies,
    skinny_gemm_enabled,
    skinny_gemm_torch,
    skinny_norm_gemm_applies,
    skinny_norm_gemm_torch,
)
from nv_kernels.skinny_gemm_config import (
    DEFAULT_NUM_SMS,
    TUNED_CONFIGS,
    SkinnyGemmConfig,
    choose_config,
    heuristic_config,
)
from nv_kernels.split_k_workspace import SplitKWorkspace
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
    with interpreted_triton_modules("nv_kernels.skinny_gemm_kernel", "nv_kernels.skinny_gemm") as (_, module):
        yield module


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> SplitKWorkspace:
    """Outputs and split-K partial sums start as NaN: a column or split the kernels skip shows up. Yields a
    fresh split-K workspace, large enough for these tests (so never regrown)."""
    monkeypatch.setattr(interp, "_empty", nan_empty)
    workspace = SplitKWorkspace()
    workspace.partials(torch.device("cpu"), 1 << 16).fill_(float("nan"))
    monkeypatch.setattr(interp, "WORKSPACE", workspace)
    return workspace


def two_pass_split_k(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, config: SkinnyGemmConfig
                     ) -> torch.Tensor:
    """The former two-kernel split-K: fp32 partial sums per K slice, added in split order, then bias, rounded."""
    k = x.shape[-1]
    per_split = math.ceil(math.ceil(k / config.split_k) / config.block_k) * config.block_k
    total = torch.zeros(x.shape[0], w.shape[0])
    for lo in range(0, k, per_split):
        total += x[:, lo:lo + per_split].float() @ w[:, lo:lo + per_split].float().T
    return (total if b is None else total + b.float()).to(x.dtype)


@pytest.mark.parametrize("m,k,rows,bias", [(1, 64, 32, False), (3, 128, 96, True), (16, 96, 48, False)])
def test_plain_default_config(interp: ModuleType, poisoned: SplitKWorkspace, m: int, k: int, rows: int,
                              bias: bool) -> None:
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
def test_split_k(interp: ModuleType, poisoned: SplitKWorkspace, m: int, k: int, rows: int,
                 config: SkinnyGemmConfig, bias: bool) -> None:
    """The last split to arrive reduces: the two-pass result, bit-stable over calls that reuse the workspace
    (no fill between them: its counters are back at 0 after each call)."""
    x, w, b = operands(m, k, rows, torch.bfloat16, bias, seed=k)
    cpu = torch.device("cpu")
    partials = poisoned.partials(cpu, 1)
    out = interp.skinny_gemm(x, w, b, config=config)
    check(out, x, w, b, gated=False)
    assert relative_error(out, two_pass_split_k(x, w, b, config)) < PLAIN_TOL   # the interpreter truncates bf16
    counters = poisoned.counters(cpu, 1)
    assert counters.numel() >= -(-rows // config.block_n) and not bool(counters.any())
    assert torch.equal(interp.skinny_gemm(x, w, b, config=config), out)             # fixed summation order
    assert poisoned.partials(cpu, 1) is partials and poisoned.counters(cpu, 1) is counters
    assert not bool(counters.any())


def test_split_k_workspace_grows_and_keeps_what_graphs_may_use() -> None:
    workspace, cpu = SplitKWorkspace(), torch.device("cpu")
    small = workspace.counters(cpu, 4)
    assert small.dtype == torch.int32 and small.numel() == 4 and not bool(small.any())
    assert workspace.counters(cpu, 3) is small                                     # big enough: reused
    grown = workspace.counters(cpu, 5)
    assert grown.numel() >= 8 and not bool(grown.any())                            # doubles, zeroed
    assert any(t is small for t in workspace._retired)                             # a captured graph's buffer
    partials = workspace.partials(cpu, 100)
    assert partials.dtype == torch.float32 and workspace.partials(cpu, 100) is partials


# add + RMSNorm in the prologue: (m, k, rows, gated, residual, config); K tails, split-K, both inner products.
NORM_CASES = [
    (3, 80, 48, False, True, SkinnyGemmConfig(block_n=16, block_k=32, split_k=2, use_dot=False)),
    (1, 64, 32, False, False, SkinnyGemmConfig(block_n=16, block_k=16, use_dot=False)),        # first layer
    (5, 64, 64, True, True, SkinnyGemmConfig(block_n=16, block_k=32, split_k=2, use_dot=True)),
    (2, 48, 32, True, False, SkinnyGemmConfig(block_n=16, block_k=32, use_dot=True)),
]


@pytest.mark.parametrize("m,k,rows,gated,with_residual,config", NORM_CASES)
def test_norm_fused_into_the_prologue(interp: ModuleType, poisoned: SplitKWorkspace, m: int, k: int, rows: int,
                                      gated: bool, with_residual: bool, config: SkinnyGemmConfig) -> None:
    """(rms_norm(x + r) * g) @ W^T, with h = x + r returned as the new residual (x itself without r).
    fp16: the interpreter rounds fp16 to nearest as the GPU does (its bf16 casts truncate), so h is exact."""
    x, w, b = operands(m, k, rows, torch.float16, bias=gated, seed=k + rows)
    gen = torch.Generator().manual_seed(m)
    r = torch.randn(m, k, generator=gen).half() if with_residual else None
    g = (torch.rand(k, generator=gen) + 0.5).half()                                 # norm weight [K]
    x0 = x.clone()
    out, h = interp.skinny_norm_gemm(x, r, g, 1e-6, w, b, gated=gated, config=config)
    ref, ref_h = skinny_norm_gemm_torch(x, r, g, 1e-6, w, b, gated=gated)
    assert torch.equal(h, ref_h) and (with_residual or h is x) and torch.equal(x, x0)
    assert out.shape == ref.shape and bool(torch.isfinite(out).all())
    assert relative_error(out, ref) < (GATED_TOL if gated else PLAIN_TOL)
    ref32, _ = skinny_norm_gemm_torch(x.float(), None if r is None else r.float(), g.float(), 1e-6, w.float(),
                                      None if b is None else b.float(), gated=gated)
    assert relative_error(out, ref32) < (GATED_TOL if gated else PLAIN_TOL)
    assert not bool(poisoned.counters(torch.device("cpu"), 1).any())


def test_norm_fused_bf16_within_the_unfused_tolerance(interp: ModuleType, poisoned: SplitKWorkspace) -> None:
    x, w, _ = operands(4, 64, 32, torch.bfloat16, bias=False, seed=11)
    r, g = torch.randn_like(x), torch.rand(64, generator=torch.Generator().manual_seed(3)).bfloat16() + 0.5
    out, h = interp.skinny_norm_gemm(x, r, g, 1e-6, w)
    ref, ref_h = skinny_norm_gemm_torch(x, r, g, 1e-6, w)
    assert relative_error(h, ref_h) < 8e-3 and relative_error(out, ref) < 2 * PLAIN_TOL
    with pytest.raises(ValueError, match="norm_weight must be"):
        interp.skinny_norm_gemm(x, r, g[:32], 1e-6, w)
    with pytest.raises(ValueError, match="residual must match"):
        interp.skinny_norm_gemm(x, r[:2], g, 1e-6, w)


class LaunchRecorder:
    """Stands in for the kernel object: records each launch's ONE_TILE, then launches the real kernel (with
    `force_loop`: the K loop, ONE_TILE False, whatever the launcher chose)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.one_tile, self.force_loop = kernel, [], False

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.one_tile.append(kwargs["ONE_TILE"])
            if self.force_loop:
                kwargs["ONE_TILE"] = False
            return self.kernel[grid](*args, **kwargs)
        return launch


# (m, k, rows, gated, norm: None / "x" / "x+r", config): every program's K range is one tile
ONE_TILE_CASES = [
    (1, 128, 64, False, None, SkinnyGemmConfig(block_n=16, block_k=64, split_k=2, use_dot=False)),  # split-K
    (1, 96, 48, True, None, SkinnyGemmConfig(block_n=16, block_k=128, use_dot=False)),     # K tail, gated
    (1, 96, 64, False, "x+r", SkinnyGemmConfig(block_n=16, block_k=128, use_dot=False)),   # norm, K tail
    (1, 64, 64, True, "x", SkinnyGemmConfig(block_n=8, block_k=64, use_dot=False)),
    (4, 64, 32, False, "x+r", SkinnyGemmConfig(block_n=16, block_k=64, use_dot=True)),
]


@pytest.mark.parametrize("m,k,rows,gated,norm,config", ONE_TILE_CASES)
def test_one_tile_per_program_equals_the_k_loop(interp: ModuleType, poisoned: SplitKWorkspace,
                                                monkeypatch: pytest.MonkeyPatch, m: int, k: int, rows: int,
                                                gated: bool, norm: str | None, config: SkinnyGemmConfig) -> None:
    """A configuration whose programs take one K tile each runs without the K loop (its weight tile loaded
    first: before the dependent-launch wait on the GPU); it gives the loop's answer and the same new residual."""
    x, w, b = operands(m, k, rows, torch.float16, bias=gated, seed=k + rows)
    gen = torch.Generator().manual_seed(m + k)
    r = torch.randn(m, k, generator=gen).half() if norm == "x+r" else None
    g = (torch.rand(k, generator=gen) + 0.5).half()
    recorder = LaunchRecorder(interp.skinny_gemm_kernel)
    monkeypatch.setattr(interp, "skinny_gemm_kernel", recorder)
    results = {}
    for one_tile in (True, False):
        recorder.force_loop = not one_tile
        if norm is None:
            results[one_tile] = (interp.skinny_gemm(x, w, b, gated=gated, config=config), x)
        else:
            results[one_tile] = interp.skinny_norm_gemm(x, r, g, 1e-6, w, b, gated=gated, config=config)
    assert recorder.one_tile == [True, True]     # the launcher's choice; the second launch ran the loop
    (out, h), (loop_out, loop_h) = results[True], results[False]
    assert torch.equal(h, loop_h)
    assert relative_error(out, loop_out) < 2e-3
    if norm is None:
        check(out, x, w, b, gated)
    else:
        ref, _ = skinny_norm_gemm_torch(x, r, g, 1e-6, w, b, gated=gated)
        assert relative_error(out, ref) < (GATED_TOL if gated else PLAIN_TOL)
    assert not bool(poisoned.counters(torch.device("cpu"), 1).any())


def test_norm_with_split_k_keeps_the_loop(interp: ModuleType, poisoned: SplitKWorkspace,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With the norm a one-tile split would see part of the row only: the rstd needs the whole row."""
    recorder = LaunchRecorder(interp.skinny_gemm_kernel)
    monkeypatch.setattr(interp, "skinny_gemm_kernel", recorder)
    x, w, _ = operands(1, 128, 32, torch.float16, bias=False, seed=5)
    g = torch.ones(128, dtype=torch.float16)
    config = SkinnyGemmConfig(block_n=16, block_k=64, split_k=2, use_dot=False)
    out, _ = interp.skinny_norm_gemm(x, None, g, 1e-6, w, config=config)
    interp.skinny_gemm(x, w, config=config)
    assert recorder.one_tile == [False, True]
    assert relative_error(out, skinny_norm_gemm_torch(x, None, g, 1e-6, w)[0]) < PLAIN_TOL


@pytest.mark.parametrize("m,k,rows,bias,config", [
    (1, 64, 64, False, SkinnyGemmConfig(block_n=16, block_k=32, use_dot=False)),   # the GEMV, two K steps
    (3, 128, 96, True, None),
    (16, 64, 64, True, SkinnyGemmConfig(block_n=16, block_k=16, split_k=2, use_dot=True)),
    (3, 80, 48, False, SkinnyGemmConfig(block_n=16, block_k=32, split_k=2, use_dot=False)),
])
def test_gated_silu_and_mul(interp: ModuleType, poisoned: SplitKWorkspace, m: int, k: int, rows: int, bias: bool,
                            config: SkinnyGemmConfig | None) -> None:
    x, w, b = operands(m, k, rows, torch.bfloat16, bias, seed=rows)
    check(interp.skinny_gemm(x, w, b, gated=True, config=config), x, w, b, gated=True)


def test_fp16_and_leading_dims(interp: ModuleType, poisoned: SplitKWorkspace) -> None:
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
    sms = DEFAULT_NUM_SMS
    # 0.6B down (N 1024, K 3072) and o (N 1024, K 2048): 64 column blocks of 16, so K is split.
    for k in (3072, 2048):
        cfg = heuristic_config(1024, k, 1, gated=False, num_sms=sms)
        assert cfg.split_k > 1 and (1024 // cfg.block_n) * cfg.split_k >= sms
        assert k // cfg.split_k >= 2 * cfg.block_k                       # each split keeps two K steps
    gate_up = heuristic_config(2 * 12288, 4096, 16, gated=True, num_sms=sms)   # 8B gate_up: columns suffice
    assert gate_up.split_k == 1 and gate_up.block_n == 32 and gate_up.use_dot
    assert not heuristic_config(4096, 1024, 1, gated=False, num_sms=sms).use_dot   # M = 1: the CUDA-core GEMV
    tuned = SkinnyGemmConfig(block_n=64, block_k=128, split_k=2, num_warps=8)
    monkeypatch.setitem(TUNED_CONFIGS, (4096, 1024, 4, False), tuned)
    monkeypatch.delitem(TUNED_CONFIGS, (4096, 1024, 8, False), raising=False)
    assert choose_config(4096, 1024, 3, gated=False) is tuned              # M 3 is in the bucket of 4
    assert choose_config(4096, 1024, 8, gated=False) is not tuned


def test_a_shape_where_torch_measured_faster_keeps_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, _ = operands(4, 32, 16, torch.bfloat16, False)
    with fused_ops("on"):
        monkeypatch.setitem(TUNED_CONFIGS, (16, 32, 4, False), SkinnyGemmConfig())
        assert skinny_gemm_applies(x, w)
        monkeypatch.setitem(TUNED_CONFIGS, (16, 32, 4, False), None)
        assert not skinny_gemm_applies(x, w)
        g = torch.ones(32, dtype=torch.bfloat16)
        assert skinny_norm_gemm_applies(x, x, g, w) and skinny_norm_gemm_applies(x, None, g, w)   # 2 kernels -> 1
        assert not skinny_norm_gemm_applies(x, x, g.float(), w) and not skinny_norm_gemm_applies(x, x[:2], g, w)
        wide = torch.cat([x, x, x])                                   # 12 rows: past the norm fusion's limit
        assert skinny_gemm_applies(wide, w)                           # the plain skinny GEMM still does
        assert not skinny_norm_gemm_applies(wide, wide, g, w)


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


@pytest.mark.parametrize("value,expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_dispatch_switch_read_at_the_first_dispatch(monkeypatch: pytest.MonkeyPatch, value: str,
                                                    expected: bool) -> None:
    """NV_SKINNY_GEMM is read when the dispatch first asks (not at import) and kept; set_skinny_gemm(None)
    forgets it, and a bad value raises, naming the variable."""
    x, w, _ = operands(2, 32, 16, torch.bfloat16, False)
    previous = set_skinny_gemm(None)
    try:
        with fused_ops("on"):
            monkeypatch.setenv("TRITON_INTERPRET", "1")
            monkeypatch.setenv("NV_SKINNY_GEMM", value)
            assert skinny_gemm_applies(x, w) is expected and skinny_gemm_enabled() is expected
            monkeypatch.setenv("NV_SKINNY_GEMM", "maybe")                        # kept: not read again
            assert skinny_gemm_applies(x, w) is expected
            assert set_skinny_gemm(None) is expected
            with pytest.raises(ValueError, match="NV_SKINNY_GEMM"):
                skinny_gemm_applies(x, w)
            assert set_skinny_gemm(not expected) is None                         # a setting reads nothing
            assert skinny_gemm_applies(x, w) is not expected
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


# Qwen3-0.6B / 8B GEMMs after a norm: (weight rows N_w, K, gated); qkv's None entries do not apply here.
GPU_NORM_SHAPES = [(4096, 1024, False), (6144, 1024, True), (6144, 4096, False), (24576, 4096, True)]


def norm_operands(m: int, k: int, rows: int, dtype: torch.dtype, seed: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, w, _ = operands(m, k, rows, dtype, bias=False, device="cuda", seed=seed)
    gen = torch.Generator("cuda").manual_seed(seed + 1)
    r = torch.randn(m, k, generator=gen, device="cuda").to(dtype) * 4                 # the residual stream
    g = (torch.rand(k, generator=gen, device="cuda") + 0.5).to(dtype)                 # norm weight [K]
    return x, r, g, w


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,k,gated", GPU_NORM_SHAPES, ids=str)
def test_gpu_norm_fused_real_shapes(monkeypatch: pytest.MonkeyPatch, rows: int, k: int, gated: bool) -> None:
    from nv_kernels import skinny_gemm as skinny

    monkeypatch.setattr(skinny, "_empty", nan_empty)
    tol = GATED_TOL if gated else PLAIN_TOL
    for m in range(1, MAX_M + 1):
        x, r, g, w = norm_operands(m, k, rows, torch.bfloat16, seed=m)
        fuses = m <= skinny.NORM_FUSION_MAX_M and k <= skinny.NORM_FUSION_MAX_K   # the layers' dispatch
        assert skinny_norm_gemm_applies(x, r, g, w) == fuses == skinny_norm_gemm_applies(x, None, g, w)
        for residual in (r, None):
            ref, ref_h = skinny_norm_gemm_torch(x, residual, g, 1e-6, w, gated=gated)
            for cfg in (None, SkinnyGemmConfig(split_k=4, use_dot=m > 2)):
                out, h = skinny.skinny_norm_gemm(x, residual, g, 1e-6, w, gated=gated, config=cfg)
                assert torch.equal(h, ref_h)                                      # the add rounds as torch's
                assert relative_error(out, ref) < tol
    assert not bool(skinny.WORKSPACE.counters(x.device, 1).any())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_split_k_workspace_never_grows_inside_a_capture() -> None:
    workspace, device = SplitKWorkspace(), torch.device("cuda", torch.cuda.current_device())
    counters = workspace.counters(device, 64)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert workspace.counters(device, 64) is counters                         # big enough: fine
        with pytest.raises(RuntimeError, match="run this shape once eagerly"):
            workspace.counters(device, 65)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_norm_fused_cuda_graph_replays_with_new_inputs() -> None:
    """qkv-like plain, gate_up-like gated and a split-K GEMM with the norm, captured once and replayed on new
    inputs: the eager result each time, bit for bit (the split-K counters return to 0 inside the graph)."""
    from nv_kernels import skinny_gemm as skinny

    split = SkinnyGemmConfig(block_n=16, block_k=256, split_k=4, use_dot=False)
    for rows, k, gated, cfg in ((4096, 1024, False, None), (6144, 1024, True, None), (1024, 3072, False, split)):
        for m in (1, 16):
            x, r, g, w = norm_operands(m, k, rows, torch.bfloat16, seed=m)
            skinny.skinny_norm_gemm(x, r, g, 1e-6, w, gated=gated, config=cfg)    # compile, size the workspace
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out, h = skinny.skinny_norm_gemm(x, r, g, 1e-6, w, gated=gated, config=cfg)
            for seed in (1, 2, 3):
                new_x, new_r, _, _ = norm_operands(m, k, rows, torch.bfloat16, seed=100 + seed)
                x.copy_(new_x)
                r.copy_(new_r)
                graph.replay()
                eager, eager_h = skinny.skinny_norm_gemm(x, r, g, 1e-6, w, gated=gated, config=cfg)
                assert torch.equal(out, eager) and torch.equal(h, eager_h)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_dependent_launch_chain_in_a_graph_equals_serial_launches() -> None:
    """Six GEMMs at M = 1, each reading the previous one's output (split-K ones sharing the workspace's
    counters; one-tile ones with their weight loaded before the wait, one with the add + RMSNorm and its new
    residual), captured with programmatic dependent launch and replayed on new inputs: bit for bit what the
    same chain gives launched without it. A kernel that read before its wait would see stale rows."""
    from nv_kernels import dependent_launch
    from nv_kernels import skinny_gemm as skinny

    device = torch.device("cuda", torch.cuda.current_device())
    if not dependent_launch.dependent_launch_enabled(device, 1):
        pytest.skip("no programmatic dependent launch on this GPU / triton")
    split = SkinnyGemmConfig(block_n=16, block_k=256, split_k=4, use_dot=False)
    gen = torch.Generator("cuda").manual_seed(7)
    weights = [(torch.randn(1024, 1024, generator=gen, device="cuda") / 32).to(torch.bfloat16) for _ in range(6)]
    x = torch.randn(1, 1024, generator=gen, device="cuda").to(torch.bfloat16)

    one_tile = SkinnyGemmConfig(block_n=4, block_k=1024, num_warps=2, num_stages=1, use_dot=False)
    norm_weight = torch.rand(1024, generator=gen, device="cuda").to(torch.bfloat16) + 0.5

    def chain(inp: torch.Tensor) -> torch.Tensor:
        residual = inp
        for i, w in enumerate(weights):
            if i == 4:
                inp, residual = skinny.skinny_norm_gemm(inp, residual, norm_weight, 1e-6, w, config=one_tile)
            else:
                inp = skinny.skinny_gemm(inp, w, config=(None, split, one_tile)[i % 3])
        return inp + residual

    chain(x)                                                               # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x)
    for seed in (1, 2, 3):
        x.copy_(torch.randn(1, 1024, generator=torch.Generator("cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        previous = dependent_launch.set_dependent_launch(False)
        try:
            serial = chain(x)
        finally:
            dependent_launch.set_dependent_launch(previous)
        assert torch.equal(out, serial)
