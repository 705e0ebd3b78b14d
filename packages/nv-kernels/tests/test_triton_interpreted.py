"""Triton kernels under TRITON_INTERPRET=1 on CPU against the torch reference (small shapes).

Triton decides interpretation when a kernel is defined, so the kernel modules are imported inside a
module-scoped fixture with the variable set (and the variable is restored afterwards).
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels.kv_layout import to_token_major, v_strides_token_major
from nv_kernels.kv_quant import dequantize, quantize
from nv_kernels.testing import PagedBatch, interpreted_triton_modules, random_paged_batch, relative_error
from nv_kernels.torch_backend import TorchBackend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
REF = TorchBackend()
TOL = 1e-5  # fp32 on the interpreter


@pytest.fixture(scope="module")
def kernels() -> Iterator[dict[str, ModuleType]]:
    with interpreted_triton_modules("nv_kernels.triton_backend", "nv_kernels.triton_decode") as (backend, decode):
        yield {"backend": backend, "decode": decode}


@pytest.fixture()
def poisoned(kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output and workspace the kernels allocate starts as NaN."""
    def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(*args, fill_value=float("nan"), **kwargs)

    monkeypatch.setattr(kernels["decode"], "_empty", nan_empty)


def _batch(seq_lens: list[int], q_lens: list[int], heads: tuple[int, int], block_size: int,
           head_dim: int = 16, seed: int = 0) -> PagedBatch:
    return random_paged_batch(seq_lens, q_lens, num_q_heads=heads[0], num_kv_heads=heads[1],
                              head_dim=head_dim, block_size=block_size, seed=seed)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("block_size,num_splits,tile", [(4, 1, None), (16, 4, None), (32, 2, 16), (1, 3, None)])
def test_decode_matches_reference(kernels: dict, poisoned: None, heads: tuple[int, int], block_size: int,
                                  num_splits: int, tile: int | None) -> None:
    seq_lens = [1, 37, 16, 70, 5]  # partial last blocks, a single token, exact pages
    b = _batch(seq_lens, [1] * len(seq_lens), heads, block_size, seed=block_size)
    out = kernels["decode"].decode_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables,
                                             max_seqlen_k=128, scale=0.25, num_splits=num_splits, tile=tile)
    ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                     max_seqlen_k=128, scale=0.25)
    assert relative_error(out, ref) < TOL


@pytest.mark.parametrize("block_size,num_splits,tile", [(4, 2, None), (16, 3, 16), (32, 1, 16)])
def test_decode_with_the_first_tile_read_ahead(kernels: dict, poisoned: None, block_size: int, num_splits: int,
                                               tile: int | None) -> None:
    """PRELOAD: each split's first tile read before the dependent-launch wait (its tokens before the newest),
    the newest token's row read again after it (stored by an earlier kernel here): the same attention."""
    seq_lens = [1, 37, 16, 70, 5, 2]  # the newest token in a first tile, in a later tile, alone
    b = _batch(seq_lens, [1] * len(seq_lens), (4, 2), block_size, seed=block_size + 5)
    out = kernels["decode"].decode_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables,
                                             max_seqlen_k=128, scale=0.25, num_splits=num_splits, tile=tile,
                                             preload=True)
    ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                     max_seqlen_k=128, scale=0.25)
    assert relative_error(out, ref) < TOL


def test_decode_zero_length_rows_do_not_fault(kernels: dict, poisoned: None) -> None:
    b = _batch([9, 3, 20], [1, 1, 1], (4, 2), 4)
    seq_lens = torch.tensor([9, 0, 20], dtype=torch.int32)
    for splits, preload in ((1, False), (4, False), (4, True)):
        out = kernels["decode"].decode_attention(b.q, b.k_cache, b.v_cache, seq_lens, b.block_tables,
                                                 max_seqlen_k=32, scale=0.5, num_splits=splits, preload=preload)
        ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=seq_lens, block_tables=b.block_tables,
                         max_seqlen_k=32, scale=0.5)
        keep = torch.tensor([0, 2])
        assert relative_error(out[keep], ref[keep]) < TOL


def test_decode_through_backend_default_splits(kernels: dict, poisoned: None) -> None:
    b = _batch([3, 50], [1, 1], (4, 1), 16, head_dim=8)  # B*Hkv = 2 programs: the default splits
    out = kernels["backend"].TritonBackend().decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens,
                                                    block_tables=b.block_tables, max_seqlen_k=4096, scale=1.0)
    ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                     max_seqlen_k=64, scale=1.0)
    assert kernels["decode"].choose_num_splits(2, 1, 4096, 4) > 1
    assert kernels["decode"].choose_num_splits(64, 8, 4096, 132) == 1   # enough programs: no merge kernel
    assert relative_error(out, ref) < TOL


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefill_matches_reference(kernels: dict, poisoned: None, heads: tuple[int, int], block_size: int) -> None:
    seq_lens = [1, 40, 23, 16, 7]
    q_lens = [1, 40, 5, 1, 7]  # fresh prompts, a cached prefix (chunked prefill), a decode row
    b = _batch(seq_lens, q_lens, heads, block_size, seed=block_size + 7)
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=0.3)
    out = kernels["backend"].TritonBackend().prefill(b.q, b.k_cache, b.v_cache, **kw)
    ref = REF.prefill(b.q, b.k_cache, b.v_cache, **kw)
    assert relative_error(out, ref) < TOL


def test_store_then_attend(kernels: dict, poisoned: None) -> None:
    """store_kvcache writes the new tokens (strided views of a fused qkv, padding slots -1)."""
    hq, hkv, d, bs = 4, 2, 16, 4
    b = _batch([6, 11], [6, 3], (hq, hkv), bs, seed=5)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(b.q.shape[0] + 1, (hq + 2 * hkv) * d, generator=gen)  # last row is padding
    key = qkv[:, hq * d:(hq + hkv) * d].view(-1, hkv, d)
    value = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
    slots = torch.cat([b.slot_mapping, torch.tensor([-1])]).to(torch.int32)
    backend = kernels["backend"].TritonBackend()
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    REF.store_kvcache(key, value, k_ref, v_ref, slots)
    backend.store_kvcache(key, value, b.k_cache, b.v_cache, slots)
    torch.testing.assert_close(b.k_cache, k_ref, rtol=0, atol=0, equal_nan=True)  # unowned slots: NaN
    torch.testing.assert_close(b.v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=0.25)
    out = backend.prefill(b.q, b.k_cache, b.v_cache, **kw)
    assert relative_error(out, REF.prefill(b.q, k_ref, v_ref, **kw)) < TOL


def test_cpu_tensors_need_the_interpreter(kernels: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    b = _batch([3], [1], (2, 2), 4)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        kernels["backend"].TritonBackend().decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens,
                                                  block_tables=b.block_tables, max_seqlen_k=4, scale=1.0)


# ---- FP8 KV cache: the Triton kernels against the torch reference on the same FP8 cache ------------------


def _fp8_batch(b: PagedBatch, dtype: torch.dtype, per_channel: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's caches quantized (NaN slots stay NaN) and their scales: amax / 200 as calibration, per
    tensor [1] or per (KV head, channel) [Hkv, D] (then K channels get magnitudes 1/8..8, as rotated keys'
    outlier channels, so a wrong channel's scale shows)."""
    if per_channel:
        gen = torch.Generator().manual_seed(5)
        spread = 2.0 ** torch.randint(-3, 4, b.k_cache.shape[2:], generator=gen).float()  # [Hkv, D]
        b.k_cache = b.k_cache * spread
        k_scale = b.k_cache.nan_to_num().abs().amax(dim=(0, 1)) / 200                    # [Hkv, D]
        v_scale = torch.rand(b.v_cache.shape[2:], generator=gen) * 0.02 + 0.01
    else:
        k_scale = (b.k_cache.nan_to_num().abs().amax() / 200).reshape(1).float()
        v_scale = torch.tensor([0.02])  # V values ~N(0, 1): many clamp at +-max * 0.02, exercising saturation
    return quantize(b.k_cache, k_scale, dtype), quantize(b.v_cache, v_scale, dtype), k_scale, v_scale


# (cache dtype, block size, splits, q dtype, per-channel scales, V token-major as the engine allocates an FP8
# cache, nv_kernels.kv_layout); a 16-bit q runs the float16 dots
FP8_DECODE_CASES = [(torch.float8_e4m3fn, 4, 1, torch.float32, False, False),
                    (torch.float8_e4m3fn, 16, 4, torch.bfloat16, True, True),
                    (torch.float8_e5m2, 1, 3, torch.float16, True, True),
                    (torch.float8_e4m3fn, 4, 2, torch.bfloat16, False, True)]   # 16-token tiles over 4-token pages
TOL_16BIT = 4e-3   # q * k_scale and the probabilities rounded to float16


@pytest.mark.parametrize("dtype,block_size,num_splits,q_dtype,per_channel,token_major", FP8_DECODE_CASES)
def test_fp8_decode_matches_reference(kernels: dict, poisoned: None, dtype: torch.dtype, block_size: int,
                                      num_splits: int, q_dtype: torch.dtype, per_channel: bool,
                                      token_major: bool) -> None:
    seq_lens = [1, 37, 16, 5]
    b = _batch(seq_lens, [1] * len(seq_lens), (4, 2), block_size, seed=block_size + 11)
    k_cache, v_cache, k_scale, v_scale = _fp8_batch(b, dtype, per_channel)
    if token_major:   # the slots past each sequence hold NaN: the unmasked token-major loads must drop them
        v_cache = to_token_major(v_cache)
        assert v_strides_token_major(v_cache) == (block_size > 1)
    q = b.q.to(q_dtype)
    # the token-major cases also read each split's first tile ahead (PRELOAD)
    out = kernels["decode"].decode_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, max_seqlen_k=128,
                                             scale=0.25, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale,
                                             preload=token_major)
    ref = REF.decode(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=128,
                     scale=0.25, k_scale=k_scale, v_scale=v_scale)
    assert out.dtype == q_dtype
    assert relative_error(out.float(), ref.float()) < (TOL if q_dtype == torch.float32 else TOL_16BIT)
    # the reference reads fp8 * scale: the same as attending over the dequantized float cache
    dense = REF.decode(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale), seq_lens=b.seq_lens,
                       block_tables=b.block_tables, max_seqlen_k=128, scale=0.25)
    assert relative_error(ref.float(), dense.float()) < TOL


def test_fp8_decode_at_the_engines_tile(kernels: dict, poisoned: None) -> None:
    """The engine's FP8 launch on a GPU: choose_tile's tile (128 tokens) gathering two 64-token pages, token-major
    V, one split; sequences within one tile, of two whole tiles and ending in a partial tile."""
    from nv_kernels.decode_tuning import choose_tile

    tile = choose_tile(64, 128, fp8=True)
    seq_lens = [1, 300, 256, 70]
    b = _batch(seq_lens, [1] * len(seq_lens), (4, 2), 64, seed=23)
    k_cache, v_cache, k_scale, v_scale = _fp8_batch(b, torch.float8_e4m3fn, per_channel=True)
    v_cache = to_token_major(v_cache)
    q = b.q.to(torch.bfloat16)
    out = kernels["decode"].decode_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, max_seqlen_k=512,
                                             scale=0.25, num_splits=1, tile=tile, k_scale=k_scale, v_scale=v_scale)
    ref = REF.decode(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=512,
                     scale=0.25, k_scale=k_scale, v_scale=v_scale)
    assert tile == 128 and relative_error(out.float(), ref.float()) < TOL_16BIT


@pytest.mark.parametrize("dtype,block_size,q_dtype,per_channel,token_major",
                         [(torch.float8_e4m3fn, 16, torch.float32, True, True),
                          (torch.float8_e5m2, 1, torch.bfloat16, False, False)])
def test_fp8_store_then_prefill_matches_reference(kernels: dict, poisoned: None, dtype: torch.dtype,
                                                  block_size: int, q_dtype: torch.dtype, per_channel: bool,
                                                  token_major: bool) -> None:
    hq, hkv, d = 8, 2, 16
    b = _batch([6, 20, 13, 7], [6, 20, 5, 1], (hq, hkv), block_size, seed=block_size + 3)
    k_cache, v_cache, _, _ = _fp8_batch(b, dtype)
    if token_major:
        v_cache = to_token_major(v_cache)
    k_scale, v_scale = torch.tensor([0.25]), torch.tensor([2.0 ** -9])   # powers of two: x / scale is exact
    if per_channel:   # [Hkv, D], still powers of two
        k_scale = k_scale * 2.0 ** torch.randint(-3, 4, (hkv, d), generator=torch.Generator().manual_seed(1))
        v_scale = v_scale * 2.0 ** torch.randint(-3, 4, (hkv, d), generator=torch.Generator().manual_seed(2))
    # New K/V: FP8 values (subnormals included) times the scale, so the store rounds nothing (the
    # interpreter's own FP8 rounding is inexact; the GPU test checks rounding), and some beyond the range.
    gen = torch.Generator().manual_seed(2)
    shape = (b.q.shape[0] + 1, hkv, d)
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).view(dtype).float().nan_to_num(0.0)
    over = torch.rand(shape, generator=gen) < 0.1
    key = torch.where(over, 1e4 * codes.sign(), codes) * k_scale         # 10 %: clamped to +-max
    value = codes * v_scale
    slots = torch.cat([b.slot_mapping, torch.tensor([-1])])
    backend = kernels["backend"].TritonBackend()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    REF.store_kvcache(key, value, k_ref, v_ref, slots, k_scale=k_scale, v_scale=v_scale)
    backend.store_kvcache(key, value, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))   # the same bytes, NaN slots too
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=0.3, k_scale=k_scale, v_scale=v_scale)
    q = b.q.to(q_dtype)
    out = backend.prefill(q, k_cache, v_cache, **kw)
    ref = REF.prefill(q, k_ref, v_ref, **kw)
    assert relative_error(out.float(), ref.float()) < (TOL if q_dtype == torch.float32 else TOL_16BIT)


def test_fp8_cache_without_scales_is_refused(kernels: dict) -> None:
    b = _batch([3], [1], (2, 2), 4)
    k_cache, v_cache, k_scale, _ = _fp8_batch(b, torch.float8_e4m3fn)
    backend = kernels["backend"].TritonBackend()
    with pytest.raises(ValueError, match="needs v_scale"):
        backend.decode(b.q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4,
                       scale=1.0, k_scale=k_scale)
    with pytest.raises(ValueError, match="needs k_scale"):
        REF.store_kvcache(b.q[:, :2], b.q[:, :2], k_cache, v_cache, b.slot_mapping)
