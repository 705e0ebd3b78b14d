"""The decoder layer in one persistent kernel (nv_kernels.decode_layer) against the layer composed of torch
references: add + RMSNorm, the q/k/v projection, q/k norm + rotary + KV store (fused_rope's reference), paged
decode (the torch backend), o projection, add + RMSNorm, gate/up, SiLU-and-mul, down. Under TRITON_INTERPRET=1
on CPU at small shapes, one program (the interpreter runs programs one after another, so a grid barrier could
not pass with more); the GPU test runs the real grid at real shapes."""
from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from nv_kernels.kv_layout import to_token_major
from nv_kernels.kv_quant import dequantize, quantize
from nv_kernels.testing import (
    decoder_layer_reference,
    interpreted_triton_modules,
    random_paged_batch,
    relative_error,
    rotary_cos_sin,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
H, HQ, HKV, D, INTER = 64, 4, 2, 16, 96
EPS = 1e-6


@pytest.fixture(scope="module")
def layer_module() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.decode_layer") as (module,):
        yield module


def _weights(dtype: torch.dtype, qk_norm: bool, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    return dict(input_norm=(torch.rand(H, generator=gen) + 0.5).to(dtype),
                post_norm=(torch.rand(H, generator=gen) + 0.5).to(dtype),
                qkv=rand((HQ + 2 * HKV) * D, H, scale=0.3), o=rand(H, HQ * D, scale=0.2),
                gate_up=rand(2 * INTER, H, scale=0.2), down=rand(H, INTER, scale=0.2),
                q_norm=(torch.rand(D, generator=gen) + 0.5).to(dtype) if qk_norm else None,
                k_norm=(torch.rand(D, generator=gen) + 0.5).to(dtype) if qk_norm else None,
                cos_sin_cache=rotary_cos_sin(256, D))


def _reference(w: dict, x: torch.Tensor, residual: torch.Tensor | None, batch, k_cache, v_cache,
               **scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return decoder_layer_reference(w, x, residual, batch.seq_lens, batch.block_tables, batch.slot_mapping,
                                   k_cache, v_cache, num_q_heads=HQ, num_kv_heads=HKV, eps=EPS, **scales)


def _run(layer_module: ModuleType, w: dict, x, residual, batch, k_cache, v_cache, **kwargs):
    layer = layer_module.DecodeLayer(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, eps=EPS, qk_eps=EPS, **w)
    layer.check()
    return layer(x, residual, k_cache=k_cache, v_cache=v_cache, seq_lens=batch.seq_lens,
                 block_tables=batch.block_tables, positions=(batch.seq_lens - 1).long(),
                 slot_mapping=batch.slot_mapping, max_seqlen_k=128, scale=D ** -0.5, **kwargs)


@pytest.mark.parametrize("rows,num_splits,with_residual,qk_norm,block_size", [
    (1, 4, True, True, 16),      # the GEMV path, split attention merged by the last split
    (3, 1, True, True, 4),       # the tensor-core path (rows padded to 16), one split
    (2, 3, False, False, 8),     # the first layer (no residual), no q/k norm (Llama)
])
def test_layer_matches_the_separate_ops(layer_module, rows: int, num_splits: int, with_residual: bool,
                                        qk_norm: bool, block_size: int) -> None:
    dtype = torch.float16   # the interpreter computes bf16 dots wrongly; fp16 is exact enough to compare
    seq_lens = [37, 5, 70][:rows]
    batch = random_paged_batch(seq_lens, [1] * rows, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                               block_size=block_size, dtype=dtype, seed=rows)
    if rows > 1:
        batch.slot_mapping[1] = -1   # a padded row (graph capture stages them): attends, stores nothing
    w = _weights(dtype, qk_norm, seed=rows)
    gen = torch.Generator().manual_seed(10 + rows)
    x = torch.randn(rows, H, generator=gen).to(dtype)
    residual = torch.randn(rows, H, generator=gen).to(dtype) if with_residual else None
    ref_k, ref_v = batch.k_cache.clone(), batch.v_cache.clone()
    ref_out, ref_r2 = _reference(w, x, residual, batch, ref_k, ref_v)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    new = batch.slot_mapping[batch.slot_mapping >= 0]
    k_cache.view(-1, HKV, D)[new] = float("nan")     # the kernel must store the new token before it reads it
    v_cache.view(-1, HKV, D)[new] = float("nan")
    out, r2 = _run(layer_module, w, x, residual, batch, k_cache, v_cache, num_splits=num_splits)
    assert relative_error(r2, ref_r2) < 1e-2
    assert relative_error(out, ref_out) < 1e-2
    assert torch.allclose(k_cache.float(), ref_k.float(), atol=2e-3, equal_nan=True)
    assert torch.allclose(v_cache.float(), ref_v.float(), atol=2e-3, equal_nan=True)
    # the counters are back at 0: a second call gives the same answer
    k_cache.view(-1, HKV, D)[new] = float("nan")
    again, _ = _run(layer_module, w, x, residual, batch, k_cache, v_cache, num_splits=num_splits)
    assert torch.equal(again, out)


def test_k_steps_unrolled_in_parts(layer_module, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the tensor-core path the K steps of an item unroll in parts that fit DOT_STAGED_BYTES of shared memory
    (the Qwen3-8B shape's down projection unrolled whole would need 1.1 MB): one step at a time here, the same
    answer as all at once."""
    dtype, rows = torch.float16, 3
    batch = random_paged_batch([37, 5, 70], [1] * rows, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, block_size=8,
                               dtype=dtype, seed=5)
    w = _weights(dtype, True, seed=5)
    gen = torch.Generator().manual_seed(6)
    x, residual = torch.randn(rows, H, generator=gen).to(dtype), torch.randn(rows, H, generator=gen).to(dtype)
    whole = layer_module.gemm_tiles(H, INTER, False, True, 1, True)
    assert whole.unroll == INTER // whole.split_k // whole.block_k > 1       # the down projection: several steps
    out_whole, _ = _run(layer_module, w, x, residual, batch, batch.k_cache.clone(), batch.v_cache.clone())
    monkeypatch.setattr(layer_module, "DOT_STAGED_BYTES", 1)
    assert layer_module.gemm_tiles(H, INTER, False, True, 1, True).unroll == 1
    ref_out, _ = _reference(w, x, residual, batch, batch.k_cache.clone(), batch.v_cache.clone())
    out_parts, _ = _run(layer_module, w, x, residual, batch, batch.k_cache.clone(), batch.v_cache.clone())
    assert relative_error(out_parts, ref_out) < 1e-2
    assert relative_error(out_parts, out_whole) < 1e-3


def test_layer_with_an_fp8_cache(layer_module) -> None:
    """e4m3 K and token-major V with per-channel scales: the kernel attends over what it stored."""
    dtype = torch.float16
    batch = random_paged_batch([21, 9], [1, 1], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, block_size=8,
                               dtype=dtype, seed=5)
    k_scale = torch.full((HKV, D), 0.02)
    v_scale = torch.rand(HKV, D, generator=torch.Generator().manual_seed(1)) * 0.02 + 0.01
    k8 = quantize(batch.k_cache, k_scale, torch.float8_e4m3fn)
    v8 = to_token_major(quantize(batch.v_cache, v_scale, torch.float8_e4m3fn))
    w = _weights(dtype, True, seed=5)
    x = torch.randn(2, H, generator=torch.Generator().manual_seed(3)).to(dtype)
    out, r2 = _run(layer_module, w, x, None, batch, k8, v8, num_splits=2, k_scale=k_scale, v_scale=v_scale)
    # the reference reads the caches the kernel wrote, stores nothing itself (slot -1) and attends in 16 bits
    # (the interpreter's FP8 roundings differ from torch's)
    k_ref, v_ref = dequantize(k8, k_scale).to(dtype), dequantize(v8.contiguous(), v_scale).to(dtype)
    ref_out, ref_r2 = _reference(w, x, None, dataclasses.replace(batch, slot_mapping=-torch.ones_like(
        batch.slot_mapping)), k_ref, v_ref)
    assert relative_error(r2, ref_r2) < 1e-2
    assert relative_error(out, ref_out) < 3e-2


def test_layer_refuses_what_it_cannot_run(layer_module) -> None:
    w = _weights(torch.float16, True, seed=0)
    batch = random_paged_batch([4], [1], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, block_size=4,
                               dtype=torch.float16)
    with pytest.raises(ValueError, match="rows"):
        _run(layer_module, w, torch.zeros(17, H, dtype=torch.float16), None, batch, batch.k_cache, batch.v_cache)
    bad = dict(w, o=w["o"][:, :-1])
    layer = layer_module.DecodeLayer(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, eps=EPS, **bad)
    with pytest.raises(ValueError, match="DecodeLayer.o"):
        layer.check()
