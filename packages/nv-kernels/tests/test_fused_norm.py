"""Fused RMSNorm (+ residual add) against its torch reference: interpreted on CPU at small shapes,
compiled on the GPU at real shapes (pytest -m gpu). Fresh random inputs, NaN-poisoned outputs.

Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest even), so bf16 is
compared within two bf16 ulps there; on the GPU most elements must match the torch path bit for bit.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import nv_kernels
from nv_kernels.fused_dispatch import fused_ops, interpreted_copy
from nv_kernels.fused_norm import rms_norm_torch

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 2 ulps of the dtype (fp16: 2**-9, bf16: 2**-6)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full(*args, fill_value=float("nan"), **kwargs)


def check_close(out: torch.Tensor, ref: torch.Tensor, min_exact: float = 0.0) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert bool(torch.isfinite(out).all())
    tol = TOL[ref.dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    if min_exact:
        exact = (out == ref).float().mean().item()
        assert exact >= min_exact, f"only {exact:.4f} of the elements equal the torch path"


def inputs(num_rows: int, hidden: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    gen = torch.Generator(device).manual_seed(seed)
    x = (torch.randn(num_rows, hidden, generator=gen, device=device) * 3).to(dtype)
    residual = torch.randn(num_rows, hidden, generator=gen, device=device).to(dtype)
    weight = (torch.rand(hidden, generator=gen, device=device) + 0.5).to(dtype)
    return x, residual, weight


@pytest.fixture(scope="module")
def interp() -> Iterator[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    yield interpreted_copy("nv_kernels.fused_norm")


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp, "_empty", nan_empty)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows,hidden", [(1, 16), (7, 40), (33, 128), (5, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_interpreted_matches_reference(interp: ModuleType, poisoned: None, dtype: torch.dtype, num_rows: int,
                                       hidden: int, with_residual: bool) -> None:
    x, residual, weight = inputs(num_rows, hidden, dtype, seed=hidden + num_rows)
    x0, r0 = x.clone(), residual.clone()
    if with_residual:
        out, new_residual = interp.rms_norm_triton(x, weight, 1e-6, residual)
        ref, ref_residual = rms_norm_torch(x, weight, 1e-6, residual)
        check_close(new_residual, ref_residual)
    else:
        out, ref = interp.rms_norm_triton(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6)
    check_close(out, ref)
    assert torch.equal(x, x0) and torch.equal(residual, r0)   # inputs are never written


def test_interpreted_strided_and_headed_inputs(interp: ModuleType, poisoned: None) -> None:
    """A column slice (row stride > H) and a [T, H, D] per-head input, as q/k norms see them."""
    base = torch.randn(9, 96)
    weight = torch.rand(32) + 0.5
    view = base[:, 16:48]                                                  # [9, 32], stride 96
    torch.testing.assert_close(interp.rms_norm_triton(view, weight, 1e-5), rms_norm_torch(view, weight, 1e-5))
    heads = base.view(9, 3, 32)                                            # [T, H, D]
    torch.testing.assert_close(interp.rms_norm_triton(heads, weight, 1e-5), rms_norm_torch(heads, weight, 1e-5))


def test_interpreted_fp32_weight_promotes_like_torch(interp: ModuleType) -> None:
    x, _, weight = inputs(3, 64, torch.bfloat16)
    out = interp.rms_norm_triton(x, weight.float(), 1e-6)
    ref = rms_norm_torch(x, weight.float(), 1e-6)
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2)


def test_interpreted_empty_batch(interp: ModuleType) -> None:
    x, residual, weight = inputs(0, 32, torch.float32)
    out, new_residual = interp.rms_norm_triton(x, weight, 1e-6, residual)
    assert out.shape == new_residual.shape == (0, 32)


@needs_triton
def test_shape_errors() -> None:
    x, residual, weight = inputs(2, 16, torch.float32)
    with pytest.raises(ValueError, match="weight must have shape"):
        nv_kernels.fused_norm.rms_norm_triton(x, weight[:8], 1e-6)
    with pytest.raises(ValueError, match="residual must match"):
        nv_kernels.fused_norm.rms_norm_triton(x, weight, 1e-6, residual.half())


def test_cpu_dispatch_runs_the_torch_path() -> None:
    x, residual, weight = inputs(4, 24, torch.bfloat16)
    for mode in ("auto", "off"):
        with fused_ops(mode):
            out, new_residual = nv_kernels.rms_norm(x, weight, 1e-6, residual)
        ref, ref_residual = rms_norm_torch(x, weight, 1e-6, residual)
        assert torch.equal(out, ref) and torch.equal(new_residual, ref_residual)


def test_fused_ops_mode_validation() -> None:
    with pytest.raises(ValueError, match="fused ops mode"):
        nv_kernels.set_fused_ops("sometimes")
    assert nv_kernels.get_fused_ops() in ("auto", "on", "off")




@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows", [1, 255, 256, 8191, 8192])
@pytest.mark.parametrize("hidden", [1024, 4096, 5120])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_torch(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, num_rows: int, hidden: int,
                           with_residual: bool) -> None:
    from nv_kernels import fused_norm

    monkeypatch.setattr(fused_norm, "_empty", nan_empty)
    x, residual, weight = inputs(num_rows, hidden, dtype, device="cuda", seed=num_rows)
    min_exact = 0.0 if dtype == torch.float32 else 0.98
    if with_residual:
        out, new_residual = fused_norm.rms_norm_triton(x, weight, 1e-6, residual)
        ref, ref_residual = rms_norm_torch(x, weight, 1e-6, residual)
        assert torch.equal(new_residual, ref_residual)                     # same add, same rounding
    else:
        out, ref = fused_norm.rms_norm_triton(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6)
    check_close(out, ref, min_exact=min_exact)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_dispatch_and_cuda_graph() -> None:
    """rms_norm picks the kernel on CUDA and replays inside a CUDA graph with new inputs."""
    x, residual, weight = inputs(256, 1024, torch.bfloat16, device="cuda")
    static_x, static_r = x.clone(), residual.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        nv_kernels.rms_norm(static_x, weight, 1e-6, static_r)             # warm up (compile) off-graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, new_residual = nv_kernels.rms_norm(static_x, weight, 1e-6, static_r)
    x2, r2, _ = inputs(256, 1024, torch.bfloat16, device="cuda", seed=7)
    static_x.copy_(x2)
    static_r.copy_(r2)
    graph.replay()
    ref, ref_residual = rms_norm_torch(x2, weight, 1e-6, r2)
    assert torch.equal(new_residual, ref_residual)
    check_close(out, ref, min_exact=0.98)
