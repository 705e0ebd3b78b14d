"""KV-cache store in Triton: scatter each token's K and V rows to its cache slot (slot < 0: skip)."""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _store_kvcache_kernel(
    KEY, VALUE, K_CACHE, V_CACHE, SLOTS,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    slot_2d = tl.zeros([H_PAD, D_PAD], tl.int64) + slot  # broadcast: the interpreter rejects scalar masks
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM) & (slot_2d >= 0)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h[:, None] * stride_ch + d[None, :]
    k = tl.load(KEY + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    tl.store(K_CACHE + dst, k.to(K_CACHE.dtype.element_ty), mask=mask)
    v = tl.load(VALUE + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(V_CACHE + dst, v.to(V_CACHE.dtype.element_ty), mask=mask)


def store_kvcache(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """key/value [T, Hkv, D] (last dim contiguous) -> caches [NB, BS, Hkv, D] at slot_mapping [T]."""
    tokens, hkv, head_dim = key.shape
    if tokens == 0:
        return
    _store_kvcache_kernel[(tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=hkv, HEAD_DIM=head_dim, H_PAD=triton.next_power_of_2(hkv),
        D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1], num_warps=4,
    )
