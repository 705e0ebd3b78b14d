"""The fused decode's start in Triton (`nv_kernels.decode_rope` describes the path): a split program's query
rows normed and rotated, and the new token's k / v stored into the paged cache by the program whose split holds
it, before any program of that split reads the cache. Used by the split decode (`nv_kernels.triton_decode`).

In two parts, so that a split program under dependent launch can read what the step staged before its first
kernel (the position's cos / sin, the slot) ahead of its wait: `rope_tables`, then `finish_query_store_new`.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import triton
import triton.language as tl

from nv_kernels.triton_store import quantize_to


@triton.jit
def _norm_rope_rows(X, row_offs, row_mask, d, W, cos, sin, eps, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                    HAS_NORM: tl.constexpr):
    """Raw heads X + row_offs[r] ([R, D_PAD] rows, unit stride along D) -> rms_norm(row) * W (HAS_NORM) rotated
    NeoX style over the whole head with cos / sin [D_PAD] (the table's halves repeated), in X's dtype. Each
    dim d is computed with its rotate_half partner (d + HALF) % D loaded beside it, rounded as fused_rope
    rounds: the norm in fp32 cast to the dtype, times the weight, cast; the rotation in fp32, cast once."""
    d_mask = d < HEAD_DIM
    partner = (d + HALF) % HEAD_DIM
    m = row_mask[:, None] & d_mask[None, :]
    x = tl.load(X + row_offs[:, None] + d[None, :], mask=m, other=0.0)                  # [R, D]
    y = tl.load(X + row_offs[:, None] + partner[None, :], mask=m, other=0.0)            # [R, D] partners
    dtype = X.dtype.element_ty
    x = x.to(tl.float32)
    y = y.to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]                        # [R, 1]
        wx = tl.load(W + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        wy = tl.load(W + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        x = ((x * inv).to(dtype).to(tl.float32) * wx).to(dtype).to(tl.float32)
        y = ((y * inv).to(dtype).to(tl.float32) * wy).to(dtype).to(tl.float32)
    y = tl.where((d < HALF)[None, :], -y, y)                                              # rotate_half's sign
    return (x * cos[None, :] + y * sin[None, :]).to(dtype)


@triton.jit
def _store_new_token(K, V, K_NEW, V_NEW, KW, K_SCALE, V_SCALE, b, kv_head, slot, rows, d, cos, sin, eps,
                     stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cb, stride_cs, stride_ch,
                     stride_vb, stride_vs, stride_vh, stride_vd, stride_ksh, stride_ksd, stride_vsh, stride_vsd,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                     HAS_NORM: tl.constexpr, FP8_MAX: tl.constexpr):
    """The new token's k (normed, rotated) and v of this KV head into the cache at `slot` (row 0 of [R, D]
    tiles; an FP8 cache gets the store kernel's quantize_to) -> the stored k and v, [D] fp32 each."""
    one = rows < 1
    d_mask = d < HEAD_DIM
    m = one[:, None] & d_mask[None, :]
    k = _norm_rope_rows(K_NEW + b.to(tl.int64) * stride_knb + kv_head * stride_knh, rows * 0, one, d, KW, cos, sin,
                        eps, HEAD_DIM, HALF, HAS_NORM)                                     # [R, D]
    v = tl.load(V_NEW + b.to(tl.int64) * stride_vnb + kv_head * stride_vnh + rows[:, None] * 0 + d[None, :],
                mask=m, other=0.0)
    page = slot // BLOCK_SIZE
    in_page = slot % BLOCK_SIZE
    k_dst = K + page * stride_cb + in_page * stride_cs + kv_head * stride_ch + rows[:, None] * 0 + d[None, :]
    v_dst = (V + page * stride_vb + in_page * stride_vs + kv_head * stride_vh + rows[:, None] * 0
             + d[None, :] * stride_vd)
    k_scales = K_SCALE + kv_head * stride_ksh + rows[:, None] * 0 + d[None, :] * stride_ksd   # [R, D] pointers
    v_scales = V_SCALE + kv_head * stride_vsh + rows[:, None] * 0 + d[None, :] * stride_vsd
    k_stored = quantize_to(k, k_scales, m, FP8_MAX, K.dtype.element_ty)
    v_stored = quantize_to(v, v_scales, m, FP8_MAX, V.dtype.element_ty)
    tl.store(k_dst, k_stored, mask=m)
    tl.store(v_dst, v_stored, mask=m)
    # row 0 as [D] fp32: what a load of the cache at `slot` now gives (exact: every cache dtype fits in fp32)
    return (tl.sum(tl.where(m, k_stored.to(tl.float32), 0.0), 0),
            tl.sum(tl.where(m, v_stored.to(tl.float32), 0.0), 0))


@triton.jit
def rope_tables(POS, COS_SIN, stride_cos, b, d, d_mask, HALF: tl.constexpr):
    """cos and sin [D_PAD] fp32 of sequence b's new token at position POS[b] (the table's halves repeated)."""
    pos = tl.maximum(tl.load(POS + b), 0)
    c = COS_SIN + pos * stride_cos + d % HALF
    cos = tl.load(c, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(c + HALF, mask=d_mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def finish_query_store_new(Q_ROW, q_offs, row_mask, rows, d, d_mask, cos, sin, slot, QW, KW, eps,
                           K, V, K_NEW, V_NEW, K_SCALE, V_SCALE, b, kv_head, seq_len, start, end,
                           stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cb, stride_cs, stride_ch,
                           stride_vb, stride_vs, stride_vh, stride_vd, stride_ksh, stride_ksd, stride_vsh,
                           stride_vsd, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                           HAS_NORM: tl.constexpr, FP8_MAX: tl.constexpr):
    """The fused decode's start for the split [start, end) of sequence b, given its cos / sin (rope_tables) and
    slot (SLOTS[b]): its query rows (raw heads at Q_ROW + q_offs) normed and rotated -> q [GP, D]; when the
    split holds the new token (seq_len - 1) and slot >= 0, that token's k (normed, rotated) and v stored into
    the cache first. Returns (q, k_new, v_new, stored): k_new / v_new [D] fp32 are the stored values (zero
    unless stored), so a caller holding a cache tile read before the store can put them in."""
    q = _norm_rope_rows(Q_ROW, q_offs, row_mask, d, QW, cos, sin, eps, HEAD_DIM, HALF, HAS_NORM)   # [GP, D]
    stored = (seq_len - 1 >= start) & (seq_len - 1 < end) & (slot >= 0)
    k_new = tl.zeros_like(cos)
    v_new = tl.zeros_like(cos)
    if stored:
        k_new, v_new = _store_new_token(K, V, K_NEW, V_NEW, KW, K_SCALE, V_SCALE, b, kv_head, slot, rows, d, cos,
                                        sin, eps, stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cb,
                                        stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                        stride_ksh, stride_ksd, stride_vsh, stride_vsd, BLOCK_SIZE, HEAD_DIM, HALF,
                                        HAS_NORM, FP8_MAX)
    tl.debug_barrier()   # the CTA's stores above precede its loads of the cache after this
    return q, k_new, v_new, stored
