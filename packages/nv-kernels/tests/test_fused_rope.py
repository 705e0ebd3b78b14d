"""Fused q/k RMSNorm + rotary (+ KV-cache store) against its torch reference: interpreted on CPU at
small shapes, compiled on the GPU at real shapes (pytest -m gpu). Inputs are strided views of one
qkv GEMM output, as the model passes them; outputs are NaN-poisoned; untouched cache slots must keep
their sentinel. bf16 within two ulps under the interpreter (it rounds toward zero).
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch

import nv_kernels
from nv_kernels.fused_dispatch import fused_ops, interpreted_copy
from nv_kernels.fused_rope import qk_norm_rope_torch
from nv_kernels.kv_layout import to_token_major
from nv_kernels.kv_quant import quantize
from nv_kernels.testing import fp8_code_agreement, relative_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
SENTINEL = 7.0


def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full(*args, fill_value=float("nan"), **kwargs)


@dataclass
class Case:
    q: torch.Tensor          # [T, Hq*D] strided view of qkv
    k: torch.Tensor          # [T, Hkv*D]
    v: torch.Tensor          # [T, Hkv*D]
    positions: torch.Tensor  # [T] int64
    cos_sin: torch.Tensor    # [P, rotary_dim] fp32
    q_weight: torch.Tensor   # [D]
    k_weight: torch.Tensor
    slots: torch.Tensor      # [T] int64, -1 = padding
    k_cache: torch.Tensor    # [NB, BS, Hkv, D] filled with SENTINEL
    v_cache: torch.Tensor


def make_case(num_tokens: int, hq: int, hkv: int, head_dim: int, rotary_dim: int, dtype: torch.dtype,
              block_size: int = 4, device: str = "cpu", seed: int = 0, num_positions: int = 4096) -> Case:
    gen = torch.Generator(device).manual_seed(seed)
    qkv = (torch.randn(num_tokens, (hq + 2 * hkv) * head_dim, generator=gen, device=device) * 2).to(dtype)
    q, k, v = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    angles = torch.rand(num_positions, rotary_dim // 2, generator=gen, device=device) * 6.3
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1) * 1.1       # scaled, as yarn's table
    positions = torch.randint(0, num_positions, (num_tokens,), generator=gen, device=device)
    weights = [(torch.rand(head_dim, generator=gen, device=device) + 0.5).to(dtype) for _ in range(2)]
    num_blocks = (2 * num_tokens) // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:num_tokens]
    slots[::3] = -1                                                           # padding rows are skipped
    cache = torch.full((num_blocks, block_size, hkv, head_dim), SENTINEL, dtype=dtype, device=device)
    return Case(q, k, v, positions, cos_sin, weights[0], weights[1], slots, cache, cache.clone())


def run(fn: Any, c: Case, head_dim: int, rotary_dim: int, norm: bool, with_v: bool, store: bool):
    k_cache, v_cache = c.k_cache.clone(), c.v_cache.clone()
    kwargs: dict[str, Any] = dict(head_dim=head_dim, rotary_dim=rotary_dim)
    if norm:
        kwargs.update(q_weight=c.q_weight, k_weight=c.k_weight, eps=1e-6)
    if store:
        kwargs.update(k_cache=k_cache, v_cache=v_cache, slot_mapping=c.slots)
    q, k, v = fn(c.q, c.k, c.v if with_v else None, c.positions, c.cos_sin, **kwargs)
    return q, k, v, k_cache, v_cache


def check_close(out: torch.Tensor, ref: torch.Tensor, min_exact: float = 0.0) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=TOL[ref.dtype], atol=TOL[ref.dtype])
    if min_exact:
        exact = (out == ref).float().mean().item()
        assert exact >= min_exact, f"only {exact:.4f} of the elements equal the torch path"


def compare(got: tuple, want: tuple, with_v: bool, store: bool, min_exact: float = 0.0) -> None:
    q, k, v, k_cache, v_cache = got
    rq, rk, rv, rk_cache, rv_cache = want
    assert q.is_contiguous() and k.is_contiguous()
    check_close(q, rq, min_exact)
    check_close(k, rk, min_exact)
    if with_v:
        assert v.is_contiguous() and torch.equal(v, rv)
    else:
        assert v is None
    if store:
        check_close(k_cache, rk_cache, min_exact)
        assert torch.equal(v_cache, rv_cache)                    # includes the untouched sentinel slots


@pytest.fixture(scope="module")
def interp() -> Iterator[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    yield interpreted_copy("nv_kernels.fused_rope")


@pytest.fixture()
def poisoned(interp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp, "_empty", nan_empty)


# (T, Hq, Hkv, D, rotary_dim, norm, with_v, store, block_size)
CASES = [
    (5, 4, 2, 16, 16, True, True, True, 4),        # Qwen3: norm + rope + store
    (7, 6, 2, 16, 16, True, True, True, 16),       # non-power-of-2 head count
    (1, 2, 2, 32, 16, True, True, True, 1),        # partial rotary, one token, block size 1
    (9, 4, 1, 16, 16, False, True, False, 4),      # Llama / Qwen2: rope only, v copied
    (6, 4, 2, 16, 8, False, False, False, 4),      # the rotary module's call: rope only, no v
    (3, 4, 4, 24, 24, True, False, False, 4),      # head_dim 24: padded halves
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_interpreted_matches_reference(interp: ModuleType, poisoned: None, dtype: torch.dtype, case: tuple) -> None:
    num_tokens, hq, hkv, d, rd, norm, with_v, store, bs = case
    c = make_case(num_tokens, hq, hkv, d, rd, dtype, block_size=bs, seed=num_tokens * d)
    inputs = [t.clone() for t in (c.q, c.k, c.v)]
    got = run(interp.qk_norm_rope_triton, c, d, rd, norm, with_v, store)
    want = run(qk_norm_rope_torch, c, d, rd, norm, with_v, store)
    compare(got, want, with_v, store)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (c.q, c.k, c.v), strict=True))   # qkv is never written


def test_interpreted_headed_inputs_and_int32_positions(interp: ModuleType, poisoned: None) -> None:
    c = make_case(4, 4, 2, 16, 16, torch.float32)
    q3, k3 = c.q.unflatten(1, (4, 16)), c.k.unflatten(1, (2, 16))       # [T, H, D] views
    got = interp.qk_norm_rope_triton(q3, k3, None, c.positions.int(), c.cos_sin, head_dim=16, rotary_dim=16)
    want = qk_norm_rope_torch(c.q, c.k, None, c.positions, c.cos_sin, head_dim=16, rotary_dim=16)
    check_close(got[0], want[0])
    check_close(got[1], want[1])


def test_argument_errors(interp: ModuleType) -> None:
    c = make_case(2, 4, 2, 16, 16, torch.float32)
    fn = interp.qk_norm_rope_triton
    with pytest.raises(ValueError, match="rotary_dim"):
        fn(c.q, c.k, None, c.positions, c.cos_sin, head_dim=16, rotary_dim=18)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        fn(c.q, c.k, None, c.positions, c.cos_sin[:, :8], head_dim=16, rotary_dim=16)
    with pytest.raises(ValueError, match="both q_weight and k_weight"):
        fn(c.q, c.k, None, c.positions, c.cos_sin, head_dim=16, rotary_dim=16, q_weight=c.q_weight)
    with pytest.raises(ValueError, match="needs v"):
        fn(c.q, c.k, None, c.positions, c.cos_sin, head_dim=16, rotary_dim=16, k_cache=c.k_cache,
           v_cache=c.v_cache, slot_mapping=c.slots)
    with pytest.raises(ValueError, match="multiple of head_dim"):
        fn(c.q[:, :40], c.k, None, c.positions, c.cos_sin, head_dim=16, rotary_dim=16)


def test_cpu_dispatch_runs_the_torch_path() -> None:
    c = make_case(3, 4, 2, 16, 16, torch.bfloat16)
    for mode in ("auto", "off"):
        with fused_ops(mode):
            got = run(nv_kernels.qk_norm_rope, c, 16, 16, True, True, True)
        want = run(qk_norm_rope_torch, c, 16, 16, True, True, True)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def run_fp8(fn: Any, c: Case, head_dim: int, fp8: torch.dtype, scales: tuple[torch.Tensor, torch.Tensor],
            token_major: bool = False):
    """Norm + rope + store into FP8 caches (start: quantized sentinel) -> (k out, k cache, v cache).
    token_major: the V cache in the engine's FP8 layout (nv_kernels.kv_layout)."""
    k_cache = quantize(c.k_cache, scales[0], fp8)
    v_cache = quantize(c.v_cache, scales[1], fp8)
    if token_major:
        v_cache = to_token_major(v_cache)
    _, k, _ = fn(c.q, c.k, c.v, c.positions, c.cos_sin, head_dim=head_dim, rotary_dim=head_dim,
                 q_weight=c.q_weight, k_weight=c.k_weight, k_cache=k_cache, v_cache=v_cache, slot_mapping=c.slots,
                 k_scale=scales[0], v_scale=scales[1])
    return k, k_cache, v_cache


@pytest.mark.parametrize("fp8,dtype,per_channel", [(torch.float8_e4m3fn, torch.float32, False),
                                                    (torch.float8_e4m3fn, torch.bfloat16, True),
                                                    (torch.float8_e5m2, torch.float32, True),
                                                    (torch.float8_e5m2, torch.bfloat16, False)])
def test_interpreted_fp8_store(interp: ModuleType, poisoned: None, fp8: torch.dtype, dtype: torch.dtype,
                               per_channel: bool) -> None:
    """The stored codes are quantize(k after norm + rope) and quantize(v), with scales per tensor or per
    (KV head, channel). The interpreter's own FP8 rounding is inexact (no carry into the exponent, truncated
    subnormals): codes may differ by one step here; the GPU test holds them equal."""
    c = make_case(7, 4, 2, 16, 16, dtype, block_size=4, seed=21)
    scales = (torch.tensor([0.01]), torch.tensor([0.004]))   # |x| up to ~8: some clamp at +-max * scale
    if per_channel:   # [Hkv, D]: each channel 1/4..4 times the per-tensor scale, so a misplaced scale shows
        gen = torch.Generator().manual_seed(3)
        scales = tuple(s * 2.0 ** torch.randint(-2, 3, (2, 16), generator=gen).float() for s in scales)
    k, k_cache, v_cache = run_fp8(interp.qk_norm_rope_triton, c, 16, fp8, scales, token_major=per_channel)
    rk, rk_cache, rv_cache = run_fp8(qk_norm_rope_torch, c, 16, fp8, scales)   # the usual layout
    check_close(k, rk)
    for got, want, scale in ((k_cache, rk_cache, scales[0]), (v_cache, rv_cache, scales[1])):
        assert (got.view(torch.uint8) == want.view(torch.uint8)).float().mean() > 0.8
        assert relative_error(got.float() * scale, want.float() * scale) < 0.1


def test_fp8_store_needs_scales(interp: ModuleType) -> None:
    c = make_case(2, 4, 2, 16, 16, torch.float32)
    fp8_cache = c.k_cache.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="needs k_scale"):
        interp.qk_norm_rope_triton(c.q, c.k, c.v, c.positions, c.cos_sin, head_dim=16, rotary_dim=16,
                                   k_cache=fp8_cache, v_cache=fp8_cache.clone(), slot_mapping=c.slots)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("num_tokens", [1, 8192])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fp8_store_matches_torch(monkeypatch: pytest.MonkeyPatch, fp8: torch.dtype, num_tokens: int) -> None:
    from nv_kernels import fused_rope

    monkeypatch.setattr(fused_rope, "_empty", nan_empty)
    c = make_case(num_tokens, 16, 8, 128, 128, torch.bfloat16, block_size=64, device="cuda", seed=num_tokens)
    scales = (torch.tensor([0.01], device="cuda"), torch.tensor([0.004], device="cuda"))
    k, k_cache, v_cache = run_fp8(fused_rope.qk_norm_rope_triton, c, 128, fp8, scales, token_major=True)
    rk, rk_cache, rv_cache = run_fp8(qk_norm_rope_torch, c, 128, fp8, scales)
    check_close(k, rk, min_exact=0.98)
    for got, want in ((k_cache, rk_cache), (v_cache, rv_cache)):
        equal, worst = fp8_code_agreement(got, want)
        assert equal > 0.98 and worst <= 1     # k rounds from k's bf16 value, which may differ by an ulp


GPU_CASES = [(16, 8, 128, 128), (32, 8, 128, 128), (32, 8, 64, 64), (64, 8, 128, 128), (16, 8, 128, 64)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 255, 256, 8192])
@pytest.mark.parametrize("heads", GPU_CASES)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_torch(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, num_tokens: int, heads: tuple,
                           block_size: int) -> None:
    from nv_kernels import fused_rope

    monkeypatch.setattr(fused_rope, "_empty", nan_empty)
    hq, hkv, d, rd = heads
    c = make_case(num_tokens, hq, hkv, d, rd, dtype, block_size=block_size, device="cuda", seed=num_tokens)
    for norm in (True, False):
        got = run(fused_rope.qk_norm_rope_triton, c, d, rd, norm, True, True)
        want = run(qk_norm_rope_torch, c, d, rd, norm, True, True)
        compare(got, want, True, True, min_exact=0.98)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fp32_and_cuda_graph() -> None:
    from nv_kernels import fused_rope

    c = make_case(256, 16, 8, 128, 128, torch.float32, block_size=16, device="cuda")
    compare(run(fused_rope.qk_norm_rope_triton, c, 128, 128, True, True, True),
            run(qk_norm_rope_torch, c, 128, 128, True, True, True), True, True)
    c = make_case(256, 16, 8, 128, 128, torch.bfloat16, block_size=16, device="cuda", seed=3)
    kw = dict(head_dim=128, rotary_dim=128, q_weight=c.q_weight, k_weight=c.k_weight, k_cache=c.k_cache,
              v_cache=c.v_cache, slot_mapping=c.slots)
    fused_rope.qk_norm_rope_triton(c.q, c.k, c.v, c.positions, c.cos_sin, **kw)   # compile off-graph
    c.k_cache.fill_(SENTINEL)
    c.v_cache.fill_(SENTINEL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, k, v = fused_rope.qk_norm_rope_triton(c.q, c.k, c.v, c.positions, c.cos_sin, **kw)
    new = make_case(256, 16, 8, 128, 128, torch.bfloat16, block_size=16, device="cuda", seed=4)
    for dst, src in ((c.q, new.q), (c.k, new.k), (c.v, new.v), (c.positions, new.positions)):
        dst.copy_(src)
    graph.replay()
    want = run(qk_norm_rope_torch, c, 128, 128, True, True, True)    # c's caches: sentinel + replay's store
    got = (q, k, v, c.k_cache, c.v_cache)
    compare(got, want, True, True, min_exact=0.98)
