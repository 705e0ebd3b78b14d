"""KV-cache store in Triton: scatter each token's K and V rows to its cache slot (slot < 0: skip).

An FP8 cache gets clamp(x / scale, +-max) rounded to nearest even, as nv_kernels.kv_quant.quantize (scale
per (KV head, channel), or one number read through zero strides)."""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from nv_kernels.kv_quant import fp8_max, is_fp8, scale_strides


@triton.jit
def quantize_to(x, scale_ptrs, mask, FP8_MAX: tl.constexpr, dtype: tl.constexpr):
    """x (float tile) -> dtype: clamp(x / scale) rounded when FP8_MAX > 0 (an FP8 cache; scale_ptrs: a tile
    of pointers to each element's scale, read where mask holds), else a cast."""
    if FP8_MAX > 0:
        y = x.to(tl.float32) / tl.load(scale_ptrs, mask=mask, other=1.0)
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
        return y.to(dtype, fp_downcast_rounding="rtne")
    return x.to(dtype)


@triton.jit
def _store_kvcache_kernel(
    KEY, VALUE, K_CACHE, V_CACHE, SLOTS, K_SCALE, V_SCALE,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FP8_MAX: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    slot_2d = tl.zeros([H_PAD, D_PAD], tl.int64) + slot  # broadcast: the interpreter rejects scalar masks
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM) & (slot_2d >= 0)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h[:, None] * stride_ch + d[None, :]
    k = tl.load(KEY + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    k_scales = K_SCALE + h[:, None] * stride_ksh + d[None, :] * stride_ksd  # [H, D] pointers
    tl.store(K_CACHE + dst, quantize_to(k, k_scales, mask, FP8_MAX, K_CACHE.dtype.element_ty), mask=mask)
    v = tl.load(VALUE + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    v_scales = V_SCALE + h[:, None] * stride_vsh + d[None, :] * stride_vsd
    v_dst = ((slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs + h[:, None] * stride_vch
             + d[None, :] * stride_vcd)   # V's own strides: token-major in an FP8 cache (kv_layout.py)
    tl.store(V_CACHE + v_dst, quantize_to(v, v_scales, mask, FP8_MAX, V_CACHE.dtype.element_ty), mask=mask)


def store_kvcache(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                  k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> None:
    """key/value [T, Hkv, D] (last dim contiguous) -> caches [NB, BS, Hkv, D] at slot_mapping [T].
    An FP8 cache needs k_scale / v_scale ([1] or [Hkv, D] float32 on the device)."""
    tokens, hkv, head_dim = key.shape
    if tokens == 0:
        return
    fp8 = is_fp8(k_cache.dtype)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"an FP8 KV cache ({k_cache.dtype}) needs k_scale and v_scale")
    k_strides = scale_strides(k_scale) if k_scale is not None else (0, 0)
    v_strides = scale_strides(v_scale) if v_scale is not None else (0, 0)
    _store_kvcache_kernel[(tokens,)](
        key, value, k_cache, v_cache, slot_mapping, slot_mapping if k_scale is None else k_scale,
        slot_mapping if v_scale is None else v_scale,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(), *k_strides, *v_strides,
        NUM_KV_HEADS=hkv, HEAD_DIM=head_dim, H_PAD=triton.next_power_of_2(hkv),
        D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1],
        FP8_MAX=fp8_max(k_cache.dtype) if fp8 else 0.0, num_warps=4,
    )
