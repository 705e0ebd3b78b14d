"""Per-head q/k RMSNorm + rotary embedding (+ the paged KV-cache store) in one Triton kernel.

One program per token: it reads the token's q, k (and v) heads straight out of the qkv GEMM output
(strided views), applies Qwen3's per-head RMSNorm (optional: Llama / Qwen2 have none), rotates the
first `rotary_dim` dims NeoX style (rotate_half, as HF's Qwen3 / Llama) with cos/sin looked up in the
rotary module's [P, rotary_dim] table (cos | sin halves; every rope scaling type only changes that
table), writes contiguous q / k / v, and optionally scatters k and v into the paged cache
[NB, BS, Hkv, D] at slot_mapping[t] (slot < 0: skip), as the backends' store_kvcache would (an FP8
cache gets clamp(x / scale) rounded, nv_kernels.kv_quant's rule, from the rounded k / v; scale per
(KV head, channel), or one number read through zero strides).
Numerics: the norm as HF (fp32, cast to the dtype, times the weight, cast), then the rotation in fp32
on that rounded value, rounded once -- the same as nv_layers' torch path.
Only builtins and this module's jit helpers inside the kernels (see fused_norm's note).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
# pyright: reportAttributeAccessIssue=false
# (that last one: tl.extra.cuda, which triton exposes at run time only)
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels.dependent_launch import launch_options
from nv_kernels.fused_dispatch import FLOAT_DTYPES, fused_ops_enabled, next_power_of_2, triton_jit
from nv_kernels.fused_norm import rms_norm_torch
from nv_kernels.kv_layout import cache_layout_supported
from nv_kernels.kv_quant import check_scales, fp8_max, is_fp8, quantize, scale_strides

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

_empty = torch.empty  # tests poison outputs through this hook


@triton_jit
def _add(a, b):
    return a + b


@triton_jit
def _to_cache(x, scale_ptrs, mask, FP8_MAX: tl.constexpr, dtype: tl.constexpr):
    """x -> the cache dtype: clamp(x / scale) rounded for an FP8 cache (FP8_MAX > 0; scale_ptrs: a tile of
    pointers to each element's scale, read where mask holds), else a cast."""
    if FP8_MAX > 0:
        y = x.to(tl.float32) / tl.load(scale_ptrs, mask=mask, other=1.0)
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
        return y.to(dtype, fp_downcast_rounding="rtne")
    return x.to(dtype)


@triton_jit
def _norm_rope_heads(
    IN, stride_it, stride_ih, OUT, stride_ot, W, t, cos, sin, eps, CACHE, stride_cb, stride_cs, stride_ch,
    slot, SCALE, stride_sh, stride_sd, N_HEADS, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
    HAS_TAIL: tl.constexpr, STORE: tl.constexpr, BLOCK_SIZE: tl.constexpr, H_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, FP8_MAX: tl.constexpr,
):
    h = tl.arange(0, H_PAD)[:, None]                                        # [H, 1]
    i = tl.arange(0, HALF_PAD)[None, :]                                     # [1, HALF]
    m = (h < N_HEADS) & (i < HALF)
    src = IN + t * stride_it + h * stride_ih
    lo = tl.load(src + i, mask=m, other=0.0).to(tl.float32)                # [H, HALF]
    hi = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    if HAS_TAIL:                                                            # dims past rotary_dim
        j = 2 * HALF + tl.arange(0, TAIL_PAD)[None, :]
        mt = (h < N_HEADS) & (j < HEAD_DIM)
        tail = tl.load(src + j, mask=mt, other=0.0).to(tl.float32)
    if HAS_NORM:
        ss = tl.reduce(lo * lo, 1, _add) + tl.reduce(hi * hi, 1, _add)    # [H]
        if HAS_TAIL:
            ss += tl.reduce(tail * tail, 1, _add)
        inv = tl.rsqrt(ss / HEAD_DIM + eps)[:, None]                        # [H, 1]
        w_lo = tl.load(W + i, mask=i < HALF, other=0.0).to(tl.float32)
        w_hi = tl.load(W + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
        lo = ((lo * inv).to(OUT.dtype.element_ty).to(tl.float32) * w_lo).to(OUT.dtype.element_ty).to(tl.float32)
        hi = ((hi * inv).to(OUT.dtype.element_ty).to(tl.float32) * w_hi).to(OUT.dtype.element_ty).to(tl.float32)
        if HAS_TAIL:
            w_t = tl.load(W + j, mask=j < HEAD_DIM, other=0.0).to(tl.float32)
            tail = ((tail * inv).to(OUT.dtype.element_ty).to(tl.float32) * w_t).to(tl.float32)
    out_lo = (lo * cos - hi * sin).to(OUT.dtype.element_ty)
    out_hi = (hi * cos + lo * sin).to(OUT.dtype.element_ty)
    dst = OUT + t * stride_ot + h * HEAD_DIM
    tl.store(dst + i, out_lo, mask=m)
    tl.store(dst + HALF + i, out_hi, mask=m)
    if HAS_TAIL:
        tl.store(dst + j, tail.to(OUT.dtype.element_ty), mask=mt)
    if STORE:
        cdst = CACHE + (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h * stride_ch
        keep = tl.full([H_PAD, HALF_PAD], 0, tl.int64) + slot >= 0         # the interpreter wants tile masks
        ty = CACHE.dtype.element_ty
        scales = SCALE + h * stride_sh                                      # [H, 1] pointers
        tl.store(cdst + i, _to_cache(out_lo, scales + i * stride_sd, m & keep, FP8_MAX, ty), mask=m & keep)
        tl.store(cdst + HALF + i, _to_cache(out_hi, scales + (HALF + i) * stride_sd, m & keep, FP8_MAX, ty),
                 mask=m & keep)
        if HAS_TAIL:
            keep_t = tl.full([H_PAD, TAIL_PAD], 0, tl.int64) + slot >= 0
            tl.store(cdst + j, _to_cache(tail.to(OUT.dtype.element_ty), scales + j * stride_sd, mt & keep_t,
                                         FP8_MAX, ty), mask=mt & keep_t)


@triton_jit
def _qk_norm_rope_kernel(
    Q, K, V, POS, COS_SIN, QW, KW, Q_OUT, K_OUT, V_OUT, SLOTS, K_CACHE, V_CACHE, K_SCALE, V_SCALE,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_qot, stride_kot, stride_vot,
    stride_cos, stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_ksh, stride_ksd, stride_vsh, stride_vsd, eps, num_q_heads, num_kv_heads,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr, HAS_TAIL: tl.constexpr,
    HAS_V: tl.constexpr, STORE: tl.constexpr, BLOCK_SIZE: tl.constexpr, HQ_PAD: tl.constexpr,
    HKV_PAD: tl.constexpr, HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, D_PAD: tl.constexpr,
    FP8_MAX: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:   # dependent_launch.py: nothing read or written before the previous kernel is done
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(POS + t).to(tl.int64)
    i = tl.arange(0, HALF_PAD)[None, :]                                     # [1, HALF]
    cos = tl.load(COS_SIN + pos * stride_cos + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(COS_SIN + pos * stride_cos + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    if STORE:
        slot = tl.load(SLOTS + t).to(tl.int64)
    else:
        slot = t * 0 - 1
    _norm_rope_heads(Q, stride_qt, stride_qh, Q_OUT, stride_qot, QW, t, cos, sin, eps, K_CACHE, stride_cb,
                     stride_cs, stride_ch, slot, K_SCALE, stride_ksh, stride_ksd, num_q_heads, HEAD_DIM, HALF,
                     HAS_NORM, HAS_TAIL, False, BLOCK_SIZE, HQ_PAD, HALF_PAD, TAIL_PAD, FP8_MAX)
    _norm_rope_heads(K, stride_kt, stride_kh, K_OUT, stride_kot, KW, t, cos, sin, eps, K_CACHE, stride_cb,
                     stride_cs, stride_ch, slot, K_SCALE, stride_ksh, stride_ksd, num_kv_heads, HEAD_DIM, HALF,
                     HAS_NORM, HAS_TAIL, STORE, BLOCK_SIZE, HKV_PAD, HALF_PAD, TAIL_PAD, FP8_MAX)
    if HAS_V:
        h = tl.arange(0, HKV_PAD)[:, None]                                  # [Hkv, 1]
        d = tl.arange(0, D_PAD)[None, :]                                    # [1, D]
        mv = (h < num_kv_heads) & (d < HEAD_DIM)
        v = tl.load(V + t * stride_vt + h * stride_vh + d, mask=mv, other=0.0)
        tl.store(V_OUT + t * stride_vot + h * HEAD_DIM + d, v, mask=mv)
        if STORE:
            keep = tl.full([HKV_PAD, D_PAD], 0, tl.int64) + slot >= 0
            cdst = V_CACHE + (slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs
            v_scales = V_SCALE + h * stride_vsh + d * stride_vsd                # [Hkv, D] pointers
            tl.store(cdst + h * stride_vch + d * stride_vcd,
                     _to_cache(v, v_scales, mv & keep, FP8_MAX, V_CACHE.dtype.element_ty), mask=mv & keep)


def _heads(x: Tensor, head_dim: int) -> Tensor:
    """[T, H*D] or [T, H, D] -> a [T, H, D] view (copied only when the last dim is strided)."""
    if x.dim() == 2:
        if x.shape[1] % head_dim:
            raise ValueError(f"last dim {x.shape[1]} is not a multiple of head_dim {head_dim}")
        x = x.unflatten(1, (x.shape[1] // head_dim, head_dim))
    if x.dim() != 3 or x.shape[2] != head_dim:
        raise ValueError(f"expected [T, H, {head_dim}] or [T, H*{head_dim}], got {tuple(x.shape)}")
    return x if x.stride(2) == 1 else x.contiguous()


def _check(q: Tensor, k: Tensor, v: Tensor | None, positions: Tensor, cos_sin_cache: Tensor,
           rotary_dim: int, head_dim: int, weights: tuple[Tensor | None, Tensor | None]) -> None:
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and in (0, head_dim={head_dim}]")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rotary_dim:
        raise ValueError(f"cos_sin_cache must be [P, {rotary_dim}], got {tuple(cos_sin_cache.shape)}")
    if q.dtype not in FLOAT_DTYPES or k.dtype != q.dtype or (v is not None and v.dtype != q.dtype):
        raise TypeError(f"q, k, v need one float dtype, got {q.dtype}, {k.dtype}, {None if v is None else v.dtype}")
    if positions.dim() != 1 or positions.shape[0] != q.shape[0] or k.shape[0] != q.shape[0]:
        raise ValueError("positions [T], q [T, ...] and k [T, ...] must agree on T")
    if (weights[0] is None) != (weights[1] is None):
        raise ValueError("give both q_weight and k_weight, or neither")
    for w in weights:
        if w is not None and (w.shape != (head_dim,) or w.dtype != q.dtype):
            raise ValueError(f"norm weights must be [{head_dim}] in {q.dtype}, got {tuple(w.shape)} {w.dtype}")


def can_store_into(k_cache: Tensor, v_cache: Tensor, num_kv_heads: int, head_dim: int) -> bool:
    """True when qk_norm_rope_triton can write k/v into these caches ([NB, BS, Hkv, D]; V with K's strides or
    token-major, `kv_layout.py`)."""
    return (k_cache.dim() == 4 and k_cache.numel() > 0 and tuple(k_cache.shape[2:]) == (num_kv_heads, head_dim)
            and cache_layout_supported(k_cache, v_cache) and k_cache.device == v_cache.device)


def qk_norm_rope_triton(
    q: Tensor, k: Tensor, v: Tensor | None, positions: Tensor, cos_sin_cache: Tensor, *, head_dim: int,
    rotary_dim: int, q_weight: Tensor | None = None, k_weight: Tensor | None = None, eps: float = 1e-6,
    k_cache: Tensor | None = None, v_cache: Tensor | None = None, slot_mapping: Tensor | None = None,
    k_scale: Tensor | None = None, v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """q [T, Hq(*D)], k/v [T, Hkv(*D)] (strided views allowed) -> new contiguous q, k, v [T, H, D].

    With k_cache/v_cache [NB, BS, Hkv, D] and slot_mapping [T], k and v are also stored in the cache
    (then v must be given; an FP8 cache also needs k_scale / v_scale). No host sync: safe inside CUDA graphs.
    """
    q3, k3 = _heads(q, head_dim), _heads(k, head_dim)                      # [T, Hq, D], [T, Hkv, D]
    v3 = None if v is None else _heads(v, head_dim)
    _check(q3, k3, v3, positions, cos_sin_cache, rotary_dim, head_dim, (q_weight, k_weight))
    store = k_cache is not None
    if store and (v3 is None or v_cache is None or slot_mapping is None):
        raise ValueError("storing into the KV cache needs v, k_cache, v_cache and slot_mapping")
    if store and not can_store_into(k_cache, v_cache, k3.shape[1], head_dim):
        raise ValueError(f"caches must be [NB, BS, {k3.shape[1]}, {head_dim}] in a layout of nv_kernels.kv_layout")
    if store:
        check_scales(k_cache, k_scale, v_scale)
    fp8 = store and is_fp8(k_cache.dtype)
    num_tokens, num_q_heads, _ = q3.shape
    num_kv_heads = k3.shape[1]
    q_out = _empty(q3.shape, dtype=q3.dtype, device=q3.device)
    k_out = _empty(k3.shape, dtype=k3.dtype, device=k3.device)
    v_out = None if v3 is None else _empty(v3.shape, dtype=v3.dtype, device=v3.device)
    if num_tokens:
        half = rotary_dim // 2
        hq_pad, d_pad = next_power_of_2(num_q_heads), next_power_of_2(head_dim)
        cache = k_cache if store else q3
        _qk_norm_rope_kernel[(num_tokens,)](
            q3, k3, q3 if v3 is None else v3, positions, cos_sin_cache,
            q3 if q_weight is None else q_weight, q3 if k_weight is None else k_weight,
            q_out, k_out, q_out if v_out is None else v_out, positions if slot_mapping is None else slot_mapping,
            cache, v_cache if store else q3, k_scale if fp8 else positions, v_scale if fp8 else positions,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
            0 if v3 is None else v3.stride(0), 0 if v3 is None else v3.stride(1),
            q_out.stride(0), k_out.stride(0), 0 if v_out is None else v_out.stride(0),
            cos_sin_cache.stride(0), cache.stride(0), cache.stride(1), cache.stride(2),
            *(v_cache.stride() if store and v_cache is not None else (0, 0, 0, 1)),
            *(scale_strides(k_scale) if fp8 and k_scale is not None else (0, 0)),
            *(scale_strides(v_scale) if fp8 and v_scale is not None else (0, 0)), float(eps),
            num_q_heads, num_kv_heads,
            HEAD_DIM=head_dim, HALF=half, HAS_NORM=q_weight is not None, HAS_TAIL=rotary_dim < head_dim,
            HAS_V=v3 is not None, STORE=store, BLOCK_SIZE=cache.shape[1] if store else 1, HQ_PAD=hq_pad,
            HKV_PAD=next_power_of_2(num_kv_heads), HALF_PAD=next_power_of_2(half),
            TAIL_PAD=next_power_of_2(max(head_dim - rotary_dim, 1)), D_PAD=d_pad,
            FP8_MAX=fp8_max(cache.dtype) if fp8 else 0.0, num_warps=max(1, min(8, hq_pad * d_pad // 512)),
            **launch_options(q3.device, num_tokens))
    return q_out, k_out, v_out


def qk_norm_rope_torch(
    q: Tensor, k: Tensor, v: Tensor | None, positions: Tensor, cos_sin_cache: Tensor, *, head_dim: int,
    rotary_dim: int, q_weight: Tensor | None = None, k_weight: Tensor | None = None, eps: float = 1e-6,
    k_cache: Tensor | None = None, v_cache: Tensor | None = None, slot_mapping: Tensor | None = None,
    k_scale: Tensor | None = None, v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The reference of qk_norm_rope_triton (same arguments, same results; the store syncs)."""
    q3, k3 = _heads(q, head_dim), _heads(k, head_dim)
    v3 = None if v is None else _heads(v, head_dim).contiguous()
    _check(q3, k3, v3, positions, cos_sin_cache, rotary_dim, head_dim, (q_weight, k_weight))
    if q_weight is not None:
        q3, k3 = rms_norm_torch(q3, q_weight, eps), rms_norm_torch(k3, k_weight, eps)
    cos, sin = cos_sin_cache.index_select(0, positions).float().unsqueeze(1).chunk(2, dim=-1)   # [T, 1, rd/2]

    def rotate(x: Tensor) -> Tensor:
        half = rotary_dim // 2
        x1, x2 = x[..., :half].float(), x[..., half:rotary_dim].float()
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary_dim:].float()], dim=-1)
        return out.to(x.dtype)

    q_out, k_out = rotate(q3), rotate(k3)
    if k_cache is not None and v_cache is not None and slot_mapping is not None and v3 is not None:  # store
        check_scales(k_cache, k_scale, v_scale)
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].long()
        block, offset = slots // k_cache.shape[1], slots % k_cache.shape[1]
        if is_fp8(k_cache.dtype) and k_scale is not None and v_scale is not None:   # uint8 views: CPU indexing
            k_cache.view(torch.uint8)[block, offset] = quantize(k_out[keep], k_scale, k_cache.dtype).view(torch.uint8)
            v_cache.view(torch.uint8)[block, offset] = quantize(v3[keep], v_scale, v_cache.dtype).view(torch.uint8)
        else:
            k_cache[block, offset] = k_out[keep].to(k_cache.dtype)
            v_cache[block, offset] = v3[keep].to(v_cache.dtype)
    return q_out, k_out, v3


def qk_norm_rope(q: Tensor, k: Tensor, v: Tensor | None, positions: Tensor, cos_sin_cache: Tensor,
                 **kwargs) -> tuple[Tensor, Tensor, Tensor | None]:
    """qk_norm_rope_triton on CUDA tensors, qk_norm_rope_torch elsewhere (same keyword arguments)."""
    tensors = [t for t in (q, k, v, positions, cos_sin_cache) if t is not None]
    if fused_ops_enabled(*tensors):
        return qk_norm_rope_triton(q, k, v, positions, cos_sin_cache, **kwargs)
    return qk_norm_rope_torch(q, k, v, positions, cos_sin_cache, **kwargs)
