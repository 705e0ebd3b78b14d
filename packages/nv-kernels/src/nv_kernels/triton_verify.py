"""Paged decode attention for Q query tokens per sequence (speculative decoding's verify steps), in Triton.

A verify step feeds each sequence its last token and its drafts: Q = 1 + k query tokens at the end of the
sequence's context, padded at the front to the same Q for every sequence so the launch shape is static (CUDA
graphs). Query token j of a sequence of length L attends to positions < L - Q + 1 + j (front padding rows attend
to a shorter prefix, or to nothing, and are ignored by the caller).

The split-KV scheme of triton_decode: one program per (sequence, KV head, split), the splits merged in the same
kernel by the last to arrive. The tile rows are the (query token, GQA head) pairs that share the KV head: row
r = j * GROUP + g is query token j, head kv_head * GROUP + g. For Qwen3-0.6B (GROUP 2) and k = 3 that is 8 rows,
as many 16-row tiles as a one-token decode: every KV byte is read once per step for all Q tokens, so a verify
step's attention costs about what a decode step's does. Ideas from vLLM's triton_unified_attention (query tokens
and heads packed into one tile); no code copied.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false, reportAttributeAccessIssue=false
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nv_kernels.decode_tuning import choose_num_splits, choose_tile, num_sms
from nv_kernels.kv_layout import v_strides_token_major
from nv_kernels.kv_quant import is_fp8, scale_strides
from nv_kernels.split_k_workspace import SplitKWorkspace
from nv_kernels.triton_decode import (
    LOG2E,
    MIN_COUNTERS,
    compute_dtype,
    load_kv_tiles,
    merge_splits_if_last,
    scaled_query,
)

_WORKSPACE = SplitKWorkspace()
_empty = torch.empty  # tests swap in a NaN-filling allocator to poison outputs and workspaces


@triton.jit
def _verify_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, limit, kv_head, d, d_mask,
                 stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale,
                 BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr,
                 V_TOKEN_MAJOR: tl.constexpr, PRECISION: tl.constexpr, COMPUTE: tl.constexpr):
    """One online-softmax step of q [R, D] over tokens n0 .. n0+TILE-1. MASKED: the tile may reach past `end` or
    past a row's causal `limit` [R] (exclusive); unmasked tiles lie below every row's limit."""
    n = n0 + tl.arange(0, TILE)
    n_mask = n < end
    k, v = load_kv_tiles(K, V, table_row, n0, n, n_mask, kv_head, d, d_mask, stride_cb, stride_cs, stride_ch,
                         stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, TILE, MASKED, V_TOKEN_MAJOR,
                         COMPUTE)  # [TILE, D] each
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [R, TILE], log2 units
    if MASKED:
        s = tl.where(n_mask[None, :] & (n[None, :] < limit[:, None]), s, float("-inf"))
        if V_TOKEN_MAJOR:   # read unmasked: p is 0 past `end`, but 0 * NaN is not
            v = tl.where(v == v, v, 0.0)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing allowed yet keeps p = 0
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["stride_tb"])
def _verify_split_kernel(
    Q, K, V, BLOCK_TABLES, SEQ_LENS, OUT, PART_O, PART_LSE, COUNTERS, K_SCALE, V_SCALE, qk_scale,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_ot, stride_oh, stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    QUERY_LEN: tl.constexpr, GROUP: tl.constexpr, ROWS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr, COMPUTE: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE) * TILE
    start = split * per_split
    end = tl.maximum(tl.minimum(start + per_split, seq_len), start)   # an empty split: end == start

    rows = tl.arange(0, ROWS_PAD)
    row_mask = rows < QUERY_LEN * GROUP
    j = rows // GROUP                                     # [R] query token of the row
    heads = kv_head * GROUP + rows % GROUP                # [R] its query head
    tokens = b.to(tl.int64) * QUERY_LEN + j               # [R] its row of q and out
    limit = seq_len - QUERY_LEN + 1 + j                   # [R] causal: positions < limit
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    table_row = BLOCK_TABLES + b.to(tl.int64) * stride_tb
    q = tl.load(Q + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [R, D]
    q = scaled_query(q, K_SCALE, kv_head, d, d_mask, stride_ksh, stride_ksd, FP8, COMPUTE)

    m_i = tl.full([ROWS_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS_PAD], tl.float32)
    acc = tl.zeros([ROWS_PAD, D_PAD], tl.float32)
    # whole tiles below every row's limit (the first query token's) and inside the split: no masks
    free = tl.minimum(end, tl.maximum(seq_len - QUERY_LEN + 1, start))
    free_end = start + (free - start) // TILE * TILE
    for n0 in range(start, free_end, TILE):
        acc, m_i, l_i = _verify_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, limit, kv_head, d, d_mask,
                                     stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                     qk_scale, BLOCK_SIZE, TILE, False, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    for n0 in range(free_end, end, TILE):   # the causal tail (at most ceil((Q - 1) / TILE) + 1 tiles)
        acc, m_i, l_i = _verify_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, limit, kv_head, d, d_mask,
                                     stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                     qk_scale, BLOCK_SIZE, TILE, True, V_TOKEN_MAJOR, PRECISION, COMPUTE)

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]  # [R, D]; zero for an empty split or a row with nothing to attend to
    if FP8:
        out = out * tl.load(V_SCALE + kv_head * stride_vsh + d * stride_vsd, mask=d_mask, other=0.0)[None, :]
    out_mask = row_mask[:, None] & d_mask[None, :]
    out_ptrs = OUT + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))  # [R]
        part = (tokens * NUM_Q_HEADS + heads) * NUM_SPLITS  # [R] first split's row of each (token, head)
        tl.store(PART_LSE + part + split, lse, mask=row_mask)
        tl.store(PART_O + (part + split)[:, None] * HEAD_DIM + d[None, :], out, mask=out_mask)
        merge_splits_if_last(PART_O, PART_LSE, COUNTERS + b * tl.num_programs(1) + kv_head, out_ptrs, part,
                             row_mask, d, out_mask, NUM_SPLITS, HEAD_DIM, ROWS_PAD, D_PAD)


def verify_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, block_tables: Tensor,
    max_seqlen_k: int, scale: float, query_len: int, *, num_splits: int | None = None, tile: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """q [B * Q, Hq, D] (sequence b's query tokens at rows b * Q .. b * Q + Q - 1, the last one newest), caches
    [NB, BS, Hkv, D] -> [B * Q, Hq, D]. Query token j of sequence b attends to positions < seq_lens[b] - Q + 1 + j.
    The splits per sequence are the one-token decode's for B sequences (static facts only: CUDA-graph safe).
    Keyword tunables are for benchmarks. An FP8 cache needs k_scale / v_scale ([1] or [Hkv, D] float32)."""
    num_tokens, hq, head_dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if query_len < 1 or num_tokens % query_len:
        raise ValueError(f"verify attention needs q rows in whole sequences of query_len={query_len}, "
                         f"got {num_tokens} rows")
    batch = num_tokens // query_len
    out = _empty(q.shape, dtype=q.dtype, device=q.device)  # [B * Q, Hq, D]
    if batch == 0:
        return out
    group = hq // hkv
    if num_splits is None:
        num_splits = choose_num_splits(batch, hkv, max_seqlen_k, num_sms(q.device))
    fp8 = is_fp8(k_cache.dtype)
    tile = tile or (choose_tile(block_size, head_dim, fp8) if q.is_cuda else 16)
    if num_splits > 1:
        part_o = _empty((num_tokens, hq, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = _empty((num_tokens, hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"an FP8 KV cache ({k_cache.dtype}) needs k_scale and v_scale")
    k_strides = scale_strides(k_scale) if k_scale is not None else (0, 0)
    v_strides = scale_strides(v_scale) if v_scale is not None else (0, 0)
    _verify_split_kernel[(batch, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_o, part_lse,
        _WORKSPACE.counters(q.device, max(batch * hkv, MIN_COUNTERS)),
        seq_lens if k_scale is None else k_scale, seq_lens if v_scale is None else v_scale, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(),
        block_tables.stride(0), out.stride(0), out.stride(1), *k_strides, *v_strides,
        QUERY_LEN=query_len, GROUP=group, ROWS_PAD=max(16, triton.next_power_of_2(query_len * group)),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size, TILE=tile,
        NUM_SPLITS=num_splits, NUM_Q_HEADS=hq, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        FP8=fp8, COMPUTE=compute_dtype(q.dtype, k_cache.dtype), V_TOKEN_MAJOR=v_strides_token_major(v_cache),
        num_warps=num_warps or 4, num_stages=num_stages or (4 if tile > block_size >= 32 and not fp8 else 2),
    )
    return out
