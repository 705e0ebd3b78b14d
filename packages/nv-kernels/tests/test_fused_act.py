"""Fused SiLU-and-mul against its torch reference: interpreted on CPU at small shapes, compiled on
the GPU at real shapes (pytest -m gpu). bf16 within two ulps under the interpreter (it rounds toward
zero); on the GPU most elements must equal the torch path bit for bit.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import nv_kernels
from nv_kernels.fused_act import silu_and_mul_torch
from nv_kernels.fused_dispatch import fused_ops, interpreted_copy

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu(-100) on numpy
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}   # 2 ulps of the dtype


def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full(*args, fill_value=float("nan"), **kwargs)


def check_close(out: torch.Tensor, ref: torch.Tensor, min_exact: float = 0.0) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, ref, rtol=TOL[ref.dtype], atol=TOL[ref.dtype])
    if min_exact:
        exact = (out == ref).float().mean().item()
        assert exact >= min_exact, f"only {exact:.4f} of the elements equal the torch path"


def gate_up(num_rows: int, width: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(num_rows, 2 * width, generator=gen, device=device) * 4   # [T, 2I]
    x[:, :3] = torch.tensor([-100.0, 100.0, 0.0], device=device)            # saturated and zero gates
    return x.to(dtype)


@pytest.fixture(scope="module")
def interp() -> Iterator[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    yield interpreted_copy("nv_kernels.fused_act")


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp, "_empty", nan_empty)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows,width,block", [(1, 8, 1024), (7, 40, 1024), (5, 300, 128), (3, 1000, 256)])
def test_interpreted_matches_reference(interp: ModuleType, poisoned: None, dtype: torch.dtype, num_rows: int,
                                       width: int, block: int) -> None:
    x = gate_up(num_rows, width, dtype, seed=width)
    x0 = x.clone()
    check_close(interp.silu_and_mul_triton(x, block=block), silu_and_mul_torch(x))
    assert torch.equal(x, x0)


def test_interpreted_strided_rows_and_3d(interp: ModuleType, poisoned: None) -> None:
    base = torch.randn(6, 100)
    view = base[:, 10:90]                                                     # [6, 80], row stride 100
    check_close(interp.silu_and_mul_triton(view), silu_and_mul_torch(view))
    batched = torch.randn(2, 3, 64)
    out = interp.silu_and_mul_triton(batched)
    assert out.shape == (2, 3, 32)
    check_close(out, silu_and_mul_torch(batched))


def test_interpreted_empty_and_odd_width(interp: ModuleType) -> None:
    assert interp.silu_and_mul_triton(torch.randn(0, 16)).shape == (0, 8)
    with pytest.raises(ValueError, match="must be even"):
        interp.silu_and_mul_triton(torch.randn(2, 7))


def test_cpu_dispatch_runs_the_torch_path() -> None:
    x = gate_up(5, 24, torch.bfloat16)
    for mode in ("auto", "off"):
        with fused_ops(mode):
            assert torch.equal(nv_kernels.silu_and_mul(x), silu_and_mul_torch(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows", [1, 255, 256, 8192])
@pytest.mark.parametrize("width", [3072, 12288, 1000])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_torch(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, num_rows: int, width: int) -> None:
    from nv_kernels import fused_act

    monkeypatch.setattr(fused_act, "_empty", nan_empty)
    x = gate_up(num_rows, width, dtype, device="cuda", seed=num_rows)
    out = fused_act.silu_and_mul_triton(x)
    check_close(out, silu_and_mul_torch(x), min_exact=0.0 if dtype == torch.float32 else 0.98)
    with fused_ops("auto"):
        assert torch.equal(nv_kernels.silu_and_mul(x), out)                 # dispatch picks the kernel
