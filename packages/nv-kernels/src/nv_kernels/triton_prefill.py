"""Varlen causal prefill attention in Triton over the paged KV cache (cached prefix + new tokens).

One program per (sequence, query tile, KV head). Tile rows are (query token, query head of this KV
head's group) pairs, so each KV tile is read once for the whole GQA group (as in vLLM's
triton_unified_attention; no code copied). Key tiles entirely after the tile's last query are never
visited; tiles entirely before its first query skip the causal mask. An FP8 cache is read as in
triton_decode (k_scale[h, :] folded into q, v_scale[h, :] applied to the output, float16 dots for a
16-bit q).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nv_kernels import triton_decode
from nv_kernels.kv_layout import v_strides_token_major
from nv_kernels.kv_quant import is_fp8, scale_strides
from nv_kernels.triton_decode import LOG2E, compute_dtype, load_kv_tiles, scaled_query


@triton.jit
def _attend_tile(q, acc, m_i, l_i, K, V, table_row, n0, kv_end, q_pos, kv_head, d, d_mask,
                 stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale,
                 BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, CAUSAL: tl.constexpr,
                 PRECISION: tl.constexpr, COMPUTE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr):
    """One online-softmax step over keys n0 .. n0+TILE_N-1."""
    n = n0 + tl.arange(0, TILE_N)
    n_mask = n < kv_end
    k, v = load_kv_tiles(K, V, table_row, n0, n, n_mask, kv_head, d, d_mask, stride_cb, stride_cs, stride_ch,
                         stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, TILE_N, True, V_TOKEN_MAJOR,
                         COMPUTE)  # [TILE_N, D] each
    if V_TOKEN_MAJOR and CAUSAL:   # read unmasked: p is 0 past kv_end, but 0 * NaN is not (the tiles
        v = tl.where(v == v, v, 0.0)   # before the causal ones lie before kv_end)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, TILE_N] log2 units
    if CAUSAL:
        s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["stride_tb"])  # table width varies per step: one variant for all
def _prefill_kernel(
    Q, K, V, OUT, CU_SEQLENS_Q, SEQ_LENS, BLOCK_TABLES, K_SCALE, V_SCALE, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch,
    stride_vb, stride_vs, stride_vh, stride_vd, stride_tb, stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr,
    FP8: tl.constexpr, COMPUTE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr,
):
    b = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(CU_SEQLENS_Q + b)
    q_len = tl.load(CU_SEQLENS_Q + b + 1) - q_start
    tok0 = q_tile * BLOCK_Q
    if tok0 >= q_len:
        return
    ctx_start = tl.load(SEQ_LENS + b) - q_len  # position of this sequence's first query

    m = tl.arange(0, BLOCK_M)
    tok = tok0 + m // GROUP  # [M] query token within the sequence
    heads = kv_head * GROUP + m % GROUP  # [M]
    row_mask = (m < BLOCK_Q * GROUP) & (tok < q_len)
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(Q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [M, D]
    q = scaled_query(q, K_SCALE, kv_head, d, d_mask, stride_ksh, stride_ksd, FP8, COMPUTE)
    q_pos = ctx_start + tok  # [M]
    table_row = BLOCK_TABLES + b.to(tl.int64) * stride_tb

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    kv_end = ctx_start + tl.minimum(tok0 + BLOCK_Q, q_len)  # keys after the tile's last query: never
    full_end = (ctx_start + tok0) // TILE_N * TILE_N  # keys every row of the tile sees
    for n0 in range(0, full_end, TILE_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, K, V, table_row, n0, kv_end, q_pos, kv_head,
                                     d, d_mask, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh,
                                     stride_vd, qk_scale, BLOCK_SIZE, TILE_N, False, PRECISION, COMPUTE,
                                     V_TOKEN_MAJOR)
    for n0 in range(full_end, kv_end, TILE_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, K, V, table_row, n0, kv_end, q_pos, kv_head,
                                     d, d_mask, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh,
                                     stride_vd, qk_scale, BLOCK_SIZE, TILE_N, True, PRECISION, COMPUTE,
                                     V_TOKEN_MAJOR)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if FP8:
        out = out * tl.load(V_SCALE + kv_head * stride_vsh + d * stride_vsd, mask=d_mask, other=0.0)[None, :]
    tl.store(OUT + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(OUT.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def prefill_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor, seq_lens: Tensor,
    block_tables: Tensor, max_seqlen_q: int, scale: float, *, block_m: int | None = None,
    tile_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
    k_scale: Tensor | None = None, v_scale: Tensor | None = None,
) -> Tensor:
    """q [T, Hq, D], caches [NB, BS, Hkv, D] -> [T, Hq, D]. Keyword tunables are for benchmarks.
    An FP8 cache needs k_scale / v_scale ([1] or [Hkv, D] float32 on the device)."""
    total, hq, head_dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    out = triton_decode._empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
    batch = seq_lens.shape[0]
    if total == 0 or batch == 0 or max_seqlen_q <= 0:
        return out
    group = hq // hkv
    on_gpu = q.device.type == "cuda"
    block_m = block_m or (128 if on_gpu else 16)
    block_m = max(block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    tile_n = tile_n or (64 if on_gpu and head_dim <= 64 else 32 if on_gpu else 16)
    grid = (batch, triton.cdiv(max_seqlen_q, block_q), hkv)
    fp8 = is_fp8(k_cache.dtype)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"an FP8 KV cache ({k_cache.dtype}) needs k_scale and v_scale")
    k_strides = scale_strides(k_scale) if k_scale is not None else (0, 0)
    v_strides = scale_strides(v_scale) if v_scale is not None else (0, 0)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables,
        seq_lens if k_scale is None else k_scale, seq_lens if v_scale is None else v_scale, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(), block_tables.stride(0),
        *k_strides, *v_strides,
        GROUP=group, HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FP8=fp8,
        COMPUTE=compute_dtype(q.dtype, k_cache.dtype), V_TOKEN_MAJOR=v_strides_token_major(v_cache),
        num_warps=num_warps or (8 if on_gpu and head_dim > 64 else 4), num_stages=num_stages or 3,
    )
    return out
