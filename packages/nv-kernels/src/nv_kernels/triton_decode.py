"""Paged decode attention in Triton: split-KV (flash-decoding) with GQA heads packed into tile rows.

Stage 1: one program per (sequence, KV head, split). The Hq/Hkv query heads that share the KV head
are the rows of one tile, so every KV byte is read once for all of them. Each split covers
cdiv(seq_len, NUM_SPLITS) tokens of its own sequence (read in-kernel), so the launch grid depends
only on (B, Hkv, NUM_SPLITS): CUDA-graph safe. The last split of a (sequence, KV head) to finish merges
the splits by log-sum-exp in the same kernel (an arrival counter per pair, back at 0 after each merge).
Ideas from SGLang / LightLLM two-stage decode and vLLM's triton_unified_attention (no code copied).
An FP8 cache is dequantized in registers with no per-element scale: k_scale[h, :] (per channel, or one
number) multiplies q once per program and v_scale[h, :] the output once (both read from device memory:
CUDA-graph safe). With a 16-bit q the FP8 tiles convert to float16, which Hopper does in one instruction
per pair (e4m3x2 -> f16x2; e5m2 -> f16 is a shift), and both dots run in float16 with float32
accumulation: q after its norm times k_scale, and probabilities in [0, 1], fit float16. bfloat16 and
float32 caches are read as before, in q's dtype.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
# pyright: reportAttributeAccessIssue=false
# (that last one: tl.extra.cuda, which triton exposes at run time only)
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nv_kernels.decode_rope import DecodeRope
from nv_kernels.decode_rope_kernel import finish_query_store_new, rope_tables
from nv_kernels.decode_tuning import choose_num_splits, choose_tile, num_sms, query_tile_rows
from nv_kernels.dependent_launch import launch_options
from nv_kernels.kv_layout import v_strides_token_major
from nv_kernels.kv_quant import fp8_max, is_fp8, scale_strides
from nv_kernels.split_k_workspace import SplitKWorkspace

LOG2E = 1.4426950408889634
# Arrival counters of the in-kernel merge, per (sequence, KV head); allocated this large at the first call so
# that they never grow while a CUDA graph is captured.
MIN_COUNTERS = 1 << 16
_WORKSPACE = SplitKWorkspace()
_empty = torch.empty  # tests swap in a NaN-filling allocator to poison outputs and workspaces


@triton.jit
def _load_kv_tile(cache, table_row, n0, n, n_mask, kv_head, d, d_mask,
                  stride_cb, stride_cs, stride_ch, stride_cd,
                  BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, MASK_TOKENS: tl.constexpr):
    """Tokens n (= n0 + arange(TILE)) of one sequence's KV head -> [TILE, D_PAD], zero past n_mask when
    MASK_TOKENS. stride_cd is 1 for the usual layout; a token-major V cache (FP8, `kv_layout.py`) has
    stride_cs 1 instead.

    Unmasked (a tile known to be full, or a token-major V tile, whose loads vectorize along the tokens
    only without a per-token mask): every address stays inside a page of the table (a tile past the
    sequence reads the rest of its last page, or page 0 for table rows past it); the caller gives such
    rows probability 0 and, for V, replaces NaN (0 * NaN would not vanish; the stores clamp, so an FP8
    cache holds no infinity).
    """
    if BLOCK_SIZE % TILE == 0:
        # The tile lies inside one page (n0 is a multiple of TILE, TILE divides BLOCK_SIZE).
        page = tl.load(table_row + n0 // BLOCK_SIZE).to(tl.int64)
        in_page = tl.multiple_of(n0 % BLOCK_SIZE, TILE)   # said outright: token-major loads vectorize on it
        base = cache + page * stride_cb + in_page * stride_cs + kv_head * stride_ch
        offs = (n - n0)[:, None] * stride_cs + d[None, :] * stride_cd
    else:
        page = tl.load(table_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)  # [TILE]
        base = cache + kv_head * stride_ch
        page_offs = page * stride_cb
        slot = n % BLOCK_SIZE
        if TILE % BLOCK_SIZE == 0:   # whole pages (n0 is a multiple of TILE): BLOCK_SIZE tokens side by side
            page_offs = tl.max_constancy(page_offs, BLOCK_SIZE)
            slot = tl.max_contiguous(tl.multiple_of(slot, BLOCK_SIZE), BLOCK_SIZE)
        offs = page_offs[:, None] + slot[:, None] * stride_cs + d[None, :] * stride_cd
    if MASK_TOKENS:
        return tl.load(base + offs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    return tl.load(base + offs, mask=d_mask[None, :], other=0.0)


@triton.jit
def load_kv_tiles(K, V, table_row, n0, n, n_mask, kv_head, d, d_mask,
                  stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                  BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr,
                  V_TOKEN_MAJOR: tl.constexpr, COMPUTE: tl.constexpr):
    """K and V tiles [TILE, D] of tokens n in COMPUTE (a no-op cast unless the cache is FP8). MASKED: zero
    past n_mask, except a token-major V tile, which is never masked per token (see _load_kv_tile)."""
    k = _load_kv_tile(K, table_row, n0, n, n_mask, kv_head, d, d_mask, stride_cb, stride_cs,
                      stride_ch, 1, BLOCK_SIZE, TILE, MASKED)
    v = _load_kv_tile(V, table_row, n0, n, n_mask, kv_head, d, d_mask, stride_vb, stride_vs,
                      stride_vh, stride_vd, BLOCK_SIZE, TILE, MASKED and not V_TOKEN_MAJOR)
    return k.to(COMPUTE), v.to(COMPUTE)


@triton.jit
def _softmax_step(q, acc, m_i, l_i, k, v, n_mask, qk_scale, MASKED: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr,
                  PRECISION: tl.constexpr, COMPUTE: tl.constexpr):
    """One online-softmax step of q [GP, D] over the tile k, v [TILE, D] (n_mask [TILE]: the tile's tokens
    inside the split, used when MASKED)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [GP, TILE], log2 units
    if MASKED:
        s = tl.where(n_mask[None, :], s, float("-inf"))
        if V_TOKEN_MAJOR:   # read unmasked: p is 0 past `end`, but 0 * NaN is not
            v = tl.where(v == v, v, 0.0)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _decode_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, kv_head, d, d_mask,
                 stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale,
                 BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr,
                 V_TOKEN_MAJOR: tl.constexpr, PRECISION: tl.constexpr, COMPUTE: tl.constexpr):
    """One online-softmax step over tokens n0 .. n0+TILE-1; MASKED: the tile may reach past `end`."""
    n = n0 + tl.arange(0, TILE)
    n_mask = n < end
    k, v = load_kv_tiles(K, V, table_row, n0, n, n_mask, kv_head, d, d_mask, stride_cb, stride_cs, stride_ch,
                         stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, TILE, MASKED, V_TOKEN_MAJOR,
                         COMPUTE)  # [TILE, D] each
    return _softmax_step(q, acc, m_i, l_i, k, v, n_mask, qk_scale, MASKED, V_TOKEN_MAJOR, PRECISION, COMPUTE)


@triton.jit
def scaled_query(q, K_SCALE, kv_head, d, d_mask, stride_ksh, stride_ksd, FP8: tl.constexpr,
                 COMPUTE: tl.constexpr):
    """q [M, D] of one KV head's query rows -> q * k_scale[kv_head, :] in COMPUTE (an FP8 cache: the
    per-channel K scale folded into the query, so the key tiles need no multiply), else q as it is."""
    if FP8:
        k_scale = tl.load(K_SCALE + kv_head * stride_ksh + d * stride_ksd, mask=d_mask, other=0.0)  # [D]
        q = (q.to(tl.float32) * k_scale[None, :]).to(COMPUTE)   # one return: its type must not vary
    return q


@triton.jit
def _attend_tiles(q, acc, m_i, l_i, K, V, table_row, n_from, end, kv_head, d, d_mask, stride_cb, stride_cs,
                  stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale, BLOCK_SIZE: tl.constexpr,
                  TILE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr, PRECISION: tl.constexpr, COMPUTE: tl.constexpr):
    """The online softmax (acc, m_i, l_i) carried over tokens [n_from, end) (n_from a multiple of TILE): whole
    tiles unmasked, then at most one partial."""
    end = tl.maximum(end, n_from)
    full_end = n_from + (end - n_from) // TILE * TILE   # tiles before it lie inside the split: no masks
    for n0 in range(n_from, full_end, TILE):
        acc, m_i, l_i = _decode_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, kv_head, d, d_mask,
                                     stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                     qk_scale, BLOCK_SIZE, TILE, False, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    for n0 in range(full_end, end, TILE):   # at most one partial tile
        acc, m_i, l_i = _decode_tile(q, acc, m_i, l_i, K, V, table_row, n0, end, kv_head, d, d_mask,
                                     stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                     qk_scale, BLOCK_SIZE, TILE, True, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    return acc, m_i, l_i


@triton.jit
def attend_split(q, K, V, table_row, start, end, kv_head, d, d_mask, stride_cb, stride_cs, stride_ch,
                 stride_vb, stride_vs, stride_vh, stride_vd, qk_scale, GROUP_PAD: tl.constexpr, D_PAD: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr,
                 PRECISION: tl.constexpr, COMPUTE: tl.constexpr):
    """Online softmax of q [GP, D] over tokens [start, end) of one sequence's KV head -> (unnormalised output
    [GP, D], running max [GP], running sum [GP]), log2 units."""
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    return _attend_tiles(q, acc, m_i, l_i, K, V, table_row, start, end, kv_head, d, d_mask, stride_cb, stride_cs,
                         stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale, BLOCK_SIZE, TILE,
                         V_TOKEN_MAJOR, PRECISION, COMPUTE)


@triton.jit
def _attend_split_preloaded(q, k, v, k_new, v_new, stored, K, V, table_row, start, end, seq_len, kv_head, d,
                            d_mask, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                            qk_scale, GROUP_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                            TILE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr, PRECISION: tl.constexpr,
                            COMPUTE: tl.constexpr):
    """attend_split with the split's first tile k, v [TILE, D] already read (its tokens before the new one,
    seq_len - 1, only). The new token's row comes from k_new / v_new [D] where this program stored it
    (`stored`); where the first tile holds it and this program did not store it (an earlier kernel of the step
    did, or nobody: slot < 0), the tile is read again now. Then the rest of the split as attend_split."""
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    if end > start:   # an empty split has no first tile (all -inf would make its step NaN)
        n = start + tl.arange(0, TILE)
        new = seq_len - 1
        if (new >= start) & (new < start + TILE) & (new < end) & (stored == 0):
            k, v = load_kv_tiles(K, V, table_row, start, n, n < end, kv_head, d, d_mask, stride_cb, stride_cs,
                                 stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, TILE, True,
                                 V_TOKEN_MAJOR, COMPUTE)
        at_new = ((n == new) & stored)[:, None]                                          # [TILE, 1]
        k = tl.where(at_new, k_new[None, :].to(COMPUTE), k)
        v = tl.where(at_new, v_new[None, :].to(COMPUTE), v)
        acc, m_i, l_i = _softmax_step(q, acc, m_i, l_i, k, v, n < end, qk_scale, True, V_TOKEN_MAJOR, PRECISION,
                                      COMPUTE)
        acc, m_i, l_i = _attend_tiles(q, acc, m_i, l_i, K, V, table_row, start + TILE, end, kv_head, d, d_mask,
                                      stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                      qk_scale, BLOCK_SIZE, TILE, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["stride_tb"])  # table width varies (eager steps): one variant for all
def _decode_split_kernel(
    Q, K, V, BLOCK_TABLES, SEQ_LENS, OUT, PART_O, PART_LSE, COUNTERS, K_SCALE, V_SCALE, qk_scale,
    stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_ob, stride_oh, stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    K_NEW, V_NEW, POS, SLOTS, COS_SIN, QW, KW, eps, stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cos,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr, COMPUTE: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr, USE_PDL: tl.constexpr, ROPE: tl.constexpr, HAS_NORM: tl.constexpr,
    HALF: tl.constexpr, FP8_MAX: tl.constexpr, PRELOAD: tl.constexpr,
):
    # ROPE (decode_rope.py): Q, K_NEW, V_NEW are the raw q/k/v heads of the new tokens; q is normed and rotated
    # here, and the program whose split holds token seq_len - 1 stores its k / v at SLOTS[b] before any read.
    # PRELOAD: the split's first KV tile (its tokens before the new one), the sequence's length, block-table row,
    # cos / sin and slot are read before the dependent-launch wait: the step stages them before its first kernel
    # and earlier steps wrote those tokens (dependent_launch.py), so the tile's round trip overlaps the previous
    # kernel and the program only reads q after the wait.
    if USE_PDL and not PRELOAD:   # dependent_launch.py: nothing read or written before the previous kernel is done
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE) * TILE
    start = split * per_split
    end = tl.maximum(tl.minimum(start + per_split, seq_len), start)   # an empty split: end == start

    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows  # [GP]
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    table_row = BLOCK_TABLES + b.to(tl.int64) * stride_tb
    if PRELOAD:
        # An empty split reads (and later drops) the sequence's last tile instead: unmasked loads (a page's table
        # entry, a token-major V tile) must stay inside its pages. A split with tokens starts at or before it.
        first = tl.minimum(start, tl.maximum(seq_len - 1, 0) // TILE * TILE)
        n_first = first + tl.arange(0, TILE)
        k_first, v_first = load_kv_tiles(K, V, table_row, first, n_first, n_first < tl.minimum(end, seq_len - 1),
                                         kv_head, d, d_mask, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs,
                                         stride_vh, stride_vd, BLOCK_SIZE, TILE, True, V_TOKEN_MAJOR, COMPUTE)
    if ROPE:
        cos, sin = rope_tables(POS, COS_SIN, stride_cos, b, d, d_mask, HALF)
        slot = tl.load(SLOTS + b)
    if USE_PDL and PRELOAD:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if ROPE:
        q, k_new, v_new, stored = finish_query_store_new(
            Q + b.to(tl.int64) * stride_qb, heads * stride_qh, row_mask, rows, d, d_mask, cos, sin, slot, QW, KW,
            eps, K, V, K_NEW, V_NEW, K_SCALE, V_SCALE, b, kv_head, seq_len, start, end, stride_knb, stride_knh,
            stride_vnb, stride_vnh, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
            stride_ksh, stride_ksd, stride_vsh, stride_vsd, BLOCK_SIZE, HEAD_DIM, HALF, HAS_NORM, FP8_MAX)  # [GP, D]
    else:
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [GP, D]
        k_new = tl.zeros([D_PAD], tl.float32)   # stored by an earlier kernel, if at all
        v_new = tl.zeros([D_PAD], tl.float32)
        stored = seq_len < 0
    q = scaled_query(q, K_SCALE, kv_head, d, d_mask, stride_ksh, stride_ksd, FP8, COMPUTE)

    if PRELOAD:
        acc, m_i, l_i = _attend_split_preloaded(q, k_first, v_first, k_new, v_new, stored, K, V, table_row, start,
                                                end, seq_len, kv_head, d, d_mask, stride_cb, stride_cs, stride_ch,
                                                stride_vb, stride_vs, stride_vh, stride_vd, qk_scale, GROUP_PAD,
                                                D_PAD, BLOCK_SIZE, TILE, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    else:
        acc, m_i, l_i = attend_split(q, K, V, table_row, start, end, kv_head, d, d_mask, stride_cb, stride_cs,
                                     stride_ch, stride_vb, stride_vs, stride_vh, stride_vd, qk_scale, GROUP_PAD,
                                     D_PAD, BLOCK_SIZE, TILE, V_TOKEN_MAJOR, PRECISION, COMPUTE)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]  # [GP, D]; zero for an empty split or seq_len 0
    if FP8:
        out = out * tl.load(V_SCALE + kv_head * stride_vsh + d * stride_vsd, mask=d_mask, other=0.0)[None, :]
    out_mask = row_mask[:, None] & d_mask[None, :]
    out_ptrs = OUT + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))  # [GP]
        part = (b * NUM_Q_HEADS + heads) * NUM_SPLITS  # [GP] first split's row of each head in [B, Hq, S]
        tl.store(PART_LSE + part + split, lse, mask=row_mask)
        tl.store(PART_O + (part + split)[:, None] * HEAD_DIM + d[None, :], out, mask=out_mask)
        merge_splits_if_last(PART_O, PART_LSE, COUNTERS + b * tl.num_programs(1) + kv_head, out_ptrs, part,
                             row_mask, d, out_mask, NUM_SPLITS, HEAD_DIM, GROUP_PAD, D_PAD)


@triton.jit
def merge_splits_if_last(PART_O, PART_LSE, COUNTER, out_ptrs, part, row_mask, d, out_mask,
                         NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP_PAD: tl.constexpr,
                         D_PAD: tl.constexpr):
    """After a split program stored its partials (PART_O rows part + split, [GP, D]; PART_LSE alike): bump the
    (sequence, KV head)'s arrival COUNTER; the last split to arrive merges all splits by log-sum-exp into out_ptrs
    [GP, D] (reading them in split order: the result does not depend on which came last) and puts the counter back
    to 0. One kernel instead of a split kernel and a merge kernel."""
    tl.debug_barrier()   # every thread's partial stores precede the release below
    arrived = tl.atomic_add(COUNTER, 1, sem="acq_rel")
    if arrived == NUM_SPLITS - 1:   # the others' partials are visible (acquire); .cg: read L2, not a stale L1
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        for s in tl.static_range(NUM_SPLITS):  # pyright: ignore[reportGeneralTypeIssues]  (unrolled: loads in flight)
            m = tl.maximum(m, tl.load(PART_LSE + part + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg"))
        m = tl.where(m == float("-inf"), 0.0, m)
        total = tl.zeros([GROUP_PAD], tl.float32)
        merged = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        for s in tl.static_range(NUM_SPLITS):  # pyright: ignore[reportGeneralTypeIssues]
            w = tl.exp2(tl.load(PART_LSE + part + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg") - m)
            o = tl.load(PART_O + (part + s)[:, None] * HEAD_DIM + d[None, :], mask=out_mask, other=0.0,
                        cache_modifier=".cg")                               # [GP, D]; w is 0 for empty splits
            total += w
            merged += o * w[:, None]
        merged = merged / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptrs, merged.to(out_ptrs.dtype.element_ty), mask=out_mask)
        tl.atomic_xchg(COUNTER, 0)


def compute_dtype(q_dtype: torch.dtype, cache_dtype: torch.dtype) -> tl.dtype:
    """The dtype of the attention dots: float16 for an FP8 cache read by a 16-bit q (exact for every FP8
    value; Hopper converts e4m3 pairs to f16 pairs directly), otherwise q's dtype (as the cache)."""
    if is_fp8(cache_dtype) and q_dtype in (torch.float16, torch.bfloat16):
        return tl.float16
    by_torch_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
    if q_dtype not in by_torch_dtype:
        raise ValueError(f"attention queries must be float16, bfloat16 or float32, got {q_dtype}")
    return by_torch_dtype[q_dtype]


def _rope_arguments(rope: DecodeRope | None, q: Tensor) -> tuple:
    """K_NEW .. stride_cos of the split kernel (q's own tensors in their place when rope is None: unused)."""
    if rope is None:
        return (q, q, q, q, q, q, q, 0.0, 0, 0, 0, 0, 0)
    return (rope.k, rope.v, rope.positions, rope.slot_mapping, rope.cos_sin_cache,
            q if rope.q_weight is None else rope.q_weight, q if rope.k_weight is None else rope.k_weight,
            float(rope.eps), rope.k.stride(0), rope.k.stride(1), rope.v.stride(0), rope.v.stride(1),
            rope.cos_sin_cache.stride(0))


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, block_tables: Tensor,
    max_seqlen_k: int, scale: float, *, num_splits: int | None = None, tile: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, k_scale: Tensor | None = None,
    v_scale: Tensor | None = None, rope: DecodeRope | None = None, preload: bool | None = None,
) -> Tensor:
    """q [B, Hq, D], caches [NB, BS, Hkv, D] -> [B, Hq, D]. Keyword tunables are for benchmarks.
    An FP8 cache needs k_scale / v_scale ([1] or [Hkv, D] float32 on the device).
    rope: q is raw (before its norm and rotary) and the new tokens' k / v are stored here (decode_rope.py). At one
    split that costs more than the separate fused_rope kernel: callers ask
    decode_tuning.fused_decode_rope_pays first.
    preload: read each split's first KV tile before the dependent-launch wait (the kernel's PRELOAD); None: where
    the launch is dependent and the cache is 16-bit (where it measured faster)."""
    batch, hq, head_dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if rope is not None:
        rope.check(q, hkv)
    out = _empty(q.shape, dtype=q.dtype, device=q.device)  # [B, Hq, D]
    if batch == 0:
        return out
    group = hq // hkv
    if num_splits is None:
        num_splits = choose_num_splits(batch, hkv, max_seqlen_k, num_sms(q.device), is_fp8(k_cache.dtype))
    tile = tile or (choose_tile(block_size, head_dim, is_fp8(k_cache.dtype)) if q.is_cuda else 16)
    d_pad = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        part_o = _empty((batch, hq, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = _empty((batch, hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    fp8 = is_fp8(k_cache.dtype)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"an FP8 KV cache ({k_cache.dtype}) needs k_scale and v_scale")
    k_strides = scale_strides(k_scale) if k_scale is not None else (0, 0)
    v_strides = scale_strides(v_scale) if v_scale is not None else (0, 0)
    pdl = launch_options(q.device, batch)
    if preload is None:
        # Under dependent launch a split program reads its first KV tile before the wait: H200, Qwen3-0.6B batch 1,
        # 43-46 us less device time per step of ~790 (BENCHMARKS.md). Not for an FP8 cache (not measured there:
        # its 256-token tiles would sit in registers across the wait), nor without dependent launch (no wait).
        preload = pdl["USE_PDL"] and not fp8
    _decode_split_kernel[(batch, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_o, part_lse,
        _WORKSPACE.counters(q.device, max(batch * hkv, MIN_COUNTERS)),
        seq_lens if k_scale is None else k_scale, seq_lens if v_scale is None else v_scale, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(),
        block_tables.stride(0), out.stride(0), out.stride(1), *k_strides, *v_strides,
        *_rope_arguments(rope, q),
        GROUP=group, GROUP_PAD=query_tile_rows(group, fp8), HEAD_DIM=head_dim, D_PAD=d_pad,
        BLOCK_SIZE=block_size, TILE=tile, NUM_SPLITS=num_splits, NUM_Q_HEADS=hq, PRECISION=precision,
        FP8=fp8, COMPUTE=compute_dtype(q.dtype, k_cache.dtype), V_TOKEN_MAJOR=v_strides_token_major(v_cache),
        ROPE=rope is not None, HAS_NORM=rope is not None and rope.q_weight is not None, HALF=head_dim // 2,
        FP8_MAX=fp8_max(k_cache.dtype) if fp8 else 0.0, PRELOAD=preload, num_warps=num_warps or 4,
        num_stages=num_stages or (4 if tile > block_size >= 32 and not fp8 else 2), **pdl,
    )
    return out
