"""The fused decode path (nv_kernels.decode_rope): the decode kernel norms and rotates q and k itself and stores
the new tokens' k / v. Under TRITON_INTERPRET=1 on CPU at small shapes, against the unfused reference: the
torch q/k norm + rotary + store (fused_rope) followed by the torch backend's decode over the stored cache."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from nv_kernels.decode_rope import DecodeRope
from nv_kernels.fused_rope import qk_norm_rope_torch
from nv_kernels.kv_layout import to_token_major
from nv_kernels.kv_quant import dequantize, quantize
from nv_kernels.testing import interpreted_triton_modules, random_paged_batch, relative_error, rotary_cos_sin
from nv_kernels.torch_backend import TorchBackend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
REF = TorchBackend()
HQ, HKV, D = 4, 2, 16


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    with interpreted_triton_modules("nv_kernels.triton_backend", "nv_kernels.triton_decode") as (backend, decode):
        yield backend, decode


@pytest.fixture()
def backend(modules: tuple[ModuleType, ModuleType]):
    return modules[0].TritonBackend()


@pytest.fixture()
def decode_module(modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return modules[1]


def _case(seq_lens: list[int], block_size: int, dtype: torch.dtype, norm: bool, seed: int):
    b = random_paged_batch(seq_lens, [1] * len(seq_lens), num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                           block_size=block_size, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    qkv = torch.randn(batch, (HQ + 2 * HKV) * D, generator=gen).to(dtype) * 3   # one row per sequence
    q, k, v = (t.view(batch, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))   # strided views
    weights = [(torch.rand(D, generator=gen) + 0.5).to(dtype) for _ in range(2)] if norm else [None, None]
    rope = DecodeRope(k=k, v=v, positions=(b.seq_lens - 1).long(), slot_mapping=b.slot_mapping.clone(),
                      cos_sin_cache=rotary_cos_sin(256, D), q_weight=weights[0], k_weight=weights[1], eps=1e-6)
    return b, q, rope


def _reference(b, q: torch.Tensor, rope: DecodeRope, k_cache: torch.Tensor, v_cache: torch.Tensor,
               **scales: torch.Tensor) -> torch.Tensor:
    q_out, _, _ = qk_norm_rope_torch(q, rope.k, rope.v, rope.positions, rope.cos_sin_cache, head_dim=D,
                                     rotary_dim=D, q_weight=rope.q_weight, k_weight=rope.k_weight, eps=rope.eps,
                                     k_cache=k_cache, v_cache=v_cache, slot_mapping=rope.slot_mapping, **scales)
    return REF.decode(q_out, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=128,
                      scale=0.25, **scales)


def _poison_new_slots(cache: torch.Tensor, slots: torch.Tensor) -> None:
    keep = slots[slots >= 0]
    cache.view(-1, *cache.shape[2:])[keep] = float("nan")   # the kernel must store before it reads


@pytest.mark.parametrize("preload", [False, True])
@pytest.mark.parametrize("block_size,num_splits,norm", [(4, 1, True), (16, 4, True), (4, 3, False), (1, 2, True)])
def test_fused_decode_matches_unfused(backend, decode_module, block_size: int, num_splits: int, norm: bool,
                                      preload: bool) -> None:
    """preload: each split's first tile read before the store of the new token (as under dependent launch), the
    new token's row put in from the registers that stored it; its slot holds NaN until the store."""
    b, q, rope = _case([1, 37, 16, 70, 5], block_size, torch.float32, norm, seed=block_size + num_splits)
    rope.slot_mapping[2] = -1     # a padded row (as graph capture stages): attends, stores nothing
    ref_k, ref_v = b.k_cache.clone(), b.v_cache.clone()
    ref = _reference(b, q, rope, ref_k, ref_v)
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
    _poison_new_slots(k_cache, rope.slot_mapping)
    _poison_new_slots(v_cache, rope.slot_mapping)
    out = decode_module.decode_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, 128, 0.25,
                                         num_splits=num_splits, rope=rope, preload=preload)
    assert relative_error(out, ref) < 1e-5
    # the random cache holds NaN in its unused slots: equal there too
    assert torch.allclose(k_cache, ref_k, atol=1e-5, equal_nan=True)
    assert torch.allclose(v_cache, ref_v, atol=1e-5, equal_nan=True)


def test_the_backend_fuses_the_decode_rope_only_with_several_splits(backend, decode_module) -> None:
    """At one split every program owns a new token (its store and barrier cost more than the separate kernel):
    the backend says the fused decode pays exactly where decode_attention would split (4 SMs off CUDA)."""
    cpu = torch.device("cpu")
    for batch, heads, context in ((1, 2, 4096), (1, 8, 4096), (3, 2, 6), (64, 8, 4096), (2, 2, 1024)):
        splits = decode_module.choose_num_splits(batch, heads, context, 4)
        assert backend.decode_rope_pays(batch, heads, context, cpu) is (splits > 1)
    assert backend.decode_rope_pays(1, 2, 4096, cpu) and not backend.decode_rope_pays(64, 8, 4096, cpu)


def test_fused_decode_through_the_backend_16bit(backend) -> None:
    # float16: the interpreter's bfloat16 dots are not exact enough to test against (plain decode too)
    b, q, rope = _case([3, 40, 9], 8, torch.float16, True, seed=3)
    b.k_cache, b.v_cache = b.k_cache.half(), b.v_cache.half()
    ref_k, ref_v = b.k_cache.clone(), b.v_cache.clone()
    ref = _reference(b, q, rope, ref_k, ref_v)
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
    _poison_new_slots(k_cache, rope.slot_mapping)
    out = backend.decode_with_rope(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                                   max_seqlen_k=128, scale=0.25, rope=rope)
    assert relative_error(out.float(), ref.float()) < 1e-2
    new = rope.slot_mapping
    got, want = (c.view(-1, HKV, D)[new].float() for c in (k_cache, ref_k))
    assert (got - want).abs().max() <= 2 ** -10 * want.abs().max()   # one float16 rounding apart at most


def test_fused_decode_fp8_token_major(backend) -> None:
    """An FP8 cache with V token-major: the new tokens land in their slots, scaled by the per-channel scales,
    and the output is attention over the cache the kernel wrote. Triton's interpreter converts to FP8 with
    wrong roundings (31.9 -> 16 where rounding carries into the exponent), so on CPU the stored values are
    checked loosely; the GPU test compares the bytes with the store kernel's."""
    b, q, rope = _case([2, 33, 12], 16, torch.bfloat16, True, seed=7)
    k_scale = torch.full((HKV, D), 0.02)
    v_scale = torch.rand(HKV, D, generator=torch.Generator().manual_seed(1)) * 0.02 + 0.01
    k8, v8 = quantize(b.k_cache, k_scale, torch.float8_e4m3fn), quantize(b.v_cache, v_scale, torch.float8_e4m3fn)
    q_out, k_out, v_out = qk_norm_rope_torch(q, rope.k, rope.v, rope.positions, rope.cos_sin_cache, head_dim=D,
                                             rotary_dim=D, q_weight=rope.q_weight, k_weight=rope.k_weight)
    assert v_out is not None
    k_cache, v_cache = k8.clone(), to_token_major(v8.clone())
    out = backend.decode_with_rope(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                                   max_seqlen_k=128, scale=0.25, rope=rope, k_scale=k_scale, v_scale=v_scale)
    new = rope.slot_mapping
    for cache, scale, exact in ((k_cache, k_scale, k_out), (v_cache, v_scale, v_out)):
        stored = dequantize(cache.contiguous(), scale).view(-1, HKV, D)[new]        # [B, Hkv, D]
        exact = exact.float().clamp(-448 * scale, 448 * scale)
        assert ((stored - exact).abs() <= 0.5 * exact.abs() + 1e-3).all()
    ref = REF.decode(q_out, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=128,
                     scale=0.25, k_scale=k_scale, v_scale=v_scale)
    # float16 dots, and q normed and rotated in-kernel may differ from torch's by a bfloat16 rounding
    assert relative_error(out.float(), ref.float()) < 1e-2
    untouched = torch.ones(k8.shape[0] * k8.shape[1], dtype=torch.bool)
    untouched[new] = False
    assert torch.equal(k_cache.view(torch.uint8).flatten(0, 1)[untouched],
                       k8.view(torch.uint8).flatten(0, 1)[untouched])


def test_rope_arguments_are_checked(backend) -> None:
    b, q, rope = _case([3, 5], 4, torch.float32, True, seed=0)
    bad = DecodeRope(k=rope.k[:, :1], v=rope.v, positions=rope.positions, slot_mapping=rope.slot_mapping,
                     cos_sin_cache=rope.cos_sin_cache)
    with pytest.raises(ValueError, match="DecodeRope.k"):
        backend.decode_with_rope(q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                                 max_seqlen_k=128, scale=0.25, rope=bad)
    half = DecodeRope(k=rope.k, v=rope.v, positions=rope.positions, slot_mapping=rope.slot_mapping,
                      cos_sin_cache=rope.cos_sin_cache[:, :8])
    with pytest.raises(ValueError, match="whole head"):
        backend.decode_with_rope(q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                                 max_seqlen_k=128, scale=0.25, rope=half)
