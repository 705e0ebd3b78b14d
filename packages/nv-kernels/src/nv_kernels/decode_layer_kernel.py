"""The Triton kernel of `nv_kernels.decode_layer`: one decoder layer of a decode step in one persistent launch.

A grid of exactly as many programs as the GPU has SMs (all resident at once) runs the layer's five phases in
turn, each program taking the phase's work items `pid, pid + P, ...`; a grid-wide barrier separates the phases
whose inputs other programs write:

  A  r1 = x (+ residual); qkv = rms_norm(r1) * w_in @ W_qkv^T            (program 0 stores r1)
     -- barrier --
  B  per (sequence, KV head, split): q/k norm + rotary, the new token's k / v into the paged cache (the split
     that holds it, before its reads), split attention; the last split of a (sequence, KV head) to finish
     merges the splits by log-sum-exp into attn                              (no barrier for the merge)
     -- barrier --
  C  r2 = attn @ W_o^T + r1 (split-K; the last split of a column block adds up and finishes)
     -- barrier --
  D  act = silu(g) * u with [g; u] = rms_norm(r2) * w_post @ W_gate_up^T
     -- barrier --
  E  out = act @ W_down^T (split-K as C)

Before the first phase every program asks L2 for all the weight rows it will stream in the layer (PREFETCH):
HBM then streams the layer's weights at once while the phases, which depend on each other through small
activations, read them from L2. The helpers are the skinny GEMM's (nv_kernels.skinny_gemm_kernel) and the
Triton decode's (nv_kernels.triton_decode), so the roundings are theirs: the layer's outputs equal the
separate kernels' up to the order of fp32 sums.

The grid barrier (`_grid_sync`) counts arrivals in SYNC[0] and bumps a generation SYNC[1] when the last program
arrives (which also puts the count back to 0): the counters need no fill between launches. Buffers written in
one phase and read in a later one are read by each program for the first time after the barrier, so no stale
L1 line can be hit; split-K partial sums and attention splits are read with .cg.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false, reportGeneralTypeIssues=false
# pyright: reportAttributeAccessIssue=false
# (that last one: tl.extra.cuda, which triton exposes at run time only)
from __future__ import annotations

import triton
import triton.language as tl

from nv_kernels.decode_rope_kernel import rope_query_store_new
from nv_kernels.skinny_gemm_kernel import _finish, _prefetch_weights, _reduced, _row_rstd, _zero_sums, k_step
from nv_kernels.triton_decode import attend_split, merge_splits_if_last, scaled_query


@triton.jit
def _grid_sync(SYNC, num_programs):
    """Every program of the grid waits here until all have arrived; writes before it are visible after it.
    The waiting programs poll with plain (volatile) loads, which L2 serves side by side, and acquire once: polling
    with atomics would queue the last arrival's release behind every program's read-modify-writes."""
    tl.debug_barrier()   # the program's threads' writes precede its arrival (released below)
    generation = tl.load(SYNC + 1, volatile=True)
    arrived = tl.atomic_add(SYNC, 1, sem="acq_rel")
    if arrived == num_programs - 1:
        tl.atomic_xchg(SYNC, 0, sem="relaxed")
        tl.atomic_add(SYNC + 1, 1, sem="release")
    else:
        while tl.load(SYNC + 1, volatile=True) == generation:
            pass
        tl.atomic_add(SYNC + 1, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _stamp(TIMES, pid, slot: tl.constexpr, TIMED: tl.constexpr):
    """TIMED: this program's global timer (ns) into TIMES[pid, slot] (the phase profile of
    scripts/bench_decode_layer.py)."""
    if TIMED:
        tl.store(TIMES + pid * 16 + slot, tl.extra.cuda.globaltimer())


@triton.jit
def _prefetch_phase(W, stride_wn, N, K, pid, num_programs, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                    GATED: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 for the weight rows of this program's items of one GEMM phase (LINES 128-byte lines per row)."""
    k_per_split = K // SPLIT_K
    for item in range(pid, tl.cdiv(N, BLOCK_N) * SPLIT_K, num_programs):
        rn = (item // SPLIT_K) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_lo = (item % SPLIT_K) * k_per_split
        _prefetch_weights(W, rn, rn < N, k_lo, k_lo + k_per_split, stride_wn, N * stride_wn, N, GATED, LINES)


@triton.jit
def _gemm_phase(X, R, stride_xm, NORM_W, rstd, W, stride_wn, OUT, stride_om, RESID, stride_rm, PART, COUNTERS,
                N, K: tl.constexpr, pid, num_programs, rm, m_mask,
                M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                USE_DOT: tl.constexpr, GATED: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                ADD_RESIDUAL: tl.constexpr, DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
                UNROLL: tl.constexpr):
    """OUT[M, N] = X[M, K] @ W^T (HAS_NORM: rms_norm(X (+ R)) * NORM_W with the rows' rstd, the sum formed tile
    by tile as the skinny GEMM's prologue forms it; GATED: silu(gate) * up of W = [gate; up]; ADD_RESIDUAL:
    + RESID, rounded as the separate add). X and R share the row stride stride_xm. SPLIT_K > 1: each item writes
    fp32 partials PART [SPLIT_K, M_PAD, N] and bumps COUNTERS[column block]; the last adds them in split order."""
    k_per_split = K // SPLIT_K          # a multiple of BLOCK_K (the launcher checks)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = X + rm[:, None] * stride_xm + rk[None, :]                        # [M_PAD, BLOCK_K]
    r_ptrs = R + rm[:, None] * stride_xm + rk[None, :]
    for item in range(pid, tl.cdiv(N, BLOCK_N) * SPLIT_K, num_programs):
        block = item // SPLIT_K
        split = item % SPLIT_K
        rn = block * BLOCK_N + tl.arange(0, BLOCK_N)                          # [BLOCK_N] output columns
        n_mask = rn < N
        k_lo = split * k_per_split
        w_ptrs = W + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]       # [BLOCK_N, BLOCK_K]
        gate = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
        up = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
        # UNROLL steps unrolled: their weight loads can be in flight at once (a loop would wait for each); one
        # pass of the outer loop when UNROLL is all of the item's steps
        for k0 in range(0, k_per_split, UNROLL * BLOCK_K):
            for kk in tl.static_range(0, UNROLL * BLOCK_K, BLOCK_K):
                gate, up = k_step(gate, up, x_ptrs, r_ptrs, NORM_W + rk, rstd, w_ptrs, N * stride_wn, m_mask,
                                  n_mask, k_lo + k0 + kk, k_lo + k_per_split, M_PAD, BLOCK_K, USE_DOT, GATED,
                                  HAS_NORM, HAS_RESIDUAL, True, DOT_IN_FP32)
        acc = _reduced(gate, M_PAD, USE_DOT)
        if GATED:
            up = _reduced(up, M_PAD, USE_DOT)
        mask = m_mask[:, None] & n_mask[None, :]                              # [M_PAD, BLOCK_N]
        finish = SPLIT_K == 1
        if SPLIT_K > 1:
            part_ptrs = PART + rm[:, None] * N + rn[None, :]
            tl.store(part_ptrs + split * (M_PAD * N), acc, mask=mask)
            tl.debug_barrier()   # every thread's partial stores precede the release below
            arrived = tl.atomic_add(COUNTERS + block, 1, sem="acq_rel")
            finish = arrived == SPLIT_K - 1
            if finish:   # the last split of the block: the others' partials are visible (acquire)
                acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):   # split order: the sum does not depend on which program came last
                    acc += tl.load(part_ptrs + s * (M_PAD * N), mask=mask, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(COUNTERS + block, 0)                           # ready for the next phase / call
        if finish:
            y = _finish(acc, up, OUT, OUT, rn[None, :], n_mask[None, :], N, GATED, False)   # OUT's dtype
            if ADD_RESIDUAL:
                r = tl.load(RESID + rm[:, None] * stride_rm + rn[None, :], mask=mask, other=0.0)
                y = (y.to(tl.float32) + r.to(tl.float32)).to(OUT.dtype.element_ty)
            tl.store(OUT + rm[:, None] * stride_om + rn[None, :], y, mask=mask)


@triton.jit
def _attention_phase(
    QKV, stride_qm, K, V, BLOCK_TABLES, stride_tb, SEQ_LENS, POS, SLOTS, COS_SIN, stride_cos, QW, KW,
    K_SCALE, V_SCALE, ATTN, stride_am, PART_O, PART_LSE, COUNTERS, M, pid, num_programs, qk_scale, eps,
    stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr,
    COMPUTE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr, HAS_NORM: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """Phase B over items (sequence b, KV head, split): triton_decode's fused split program (decode_rope.py),
    whose output goes to ATTN [M, Hq * D] directly at one split, else through PART_O [M, Hq, S, D] /
    PART_LSE [M, Hq, S] and the merge by the last split to arrive (COUNTERS [M, Hkv])."""
    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    out_mask = row_mask[:, None] & d_mask[None, :]
    k_offset = NUM_Q_HEADS * HEAD_DIM                 # k and v of the new token in a qkv row
    v_offset = (NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM
    for item in range(pid, M * NUM_KV_HEADS * NUM_SPLITS, num_programs):
        b = item // (NUM_KV_HEADS * NUM_SPLITS)
        kv_head = (item // NUM_SPLITS) % NUM_KV_HEADS
        split = item % NUM_SPLITS
        seq_len = tl.load(SEQ_LENS + b)
        per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE) * TILE
        start = split * per_split
        end = tl.maximum(tl.minimum(start + per_split, seq_len), start)   # an empty split: end == start
        heads = kv_head * GROUP + rows                                    # [GP]
        q = rope_query_store_new(QKV + b.to(tl.int64) * stride_qm, heads * HEAD_DIM, row_mask, rows, d, d_mask, POS,
                                 SLOTS, COS_SIN, stride_cos, QW, KW, eps, K, V, QKV + k_offset, QKV + v_offset,
                                 K_SCALE, V_SCALE, b, kv_head, seq_len, start, end, stride_qm, HEAD_DIM, stride_qm,
                                 HEAD_DIM, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                                 stride_ksh, stride_ksd, stride_vsh, stride_vsd, BLOCK_SIZE, HEAD_DIM, HALF, HAS_NORM,
                                 FP8_MAX)                                 # [GP, D]
        q = scaled_query(q, K_SCALE, kv_head, d, d_mask, stride_ksh, stride_ksd, FP8, COMPUTE)
        acc, m_i, l_i = attend_split(q, K, V, BLOCK_TABLES + b.to(tl.int64) * stride_tb, start, end, kv_head, d,
                                     d_mask, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh,
                                     stride_vd, qk_scale, GROUP_PAD, D_PAD, BLOCK_SIZE, TILE, V_TOKEN_MAJOR, PRECISION,
                                     COMPUTE)
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        out = acc / safe_l[:, None]                                       # [GP, D]
        if FP8:
            out = out * tl.load(V_SCALE + kv_head * stride_vsh + d * stride_vsd, mask=d_mask, other=0.0)[None, :]
        attn_ptrs = ATTN + b * stride_am + heads[:, None] * HEAD_DIM + d[None, :]
        if NUM_SPLITS == 1:
            tl.store(attn_ptrs, out.to(ATTN.dtype.element_ty), mask=out_mask)
        else:
            part = (b * NUM_Q_HEADS + heads) * NUM_SPLITS                 # [GP] first split of each head
            tl.store(PART_LSE + part + split, tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf")),
                     mask=row_mask)
            tl.store(PART_O + (part + split)[:, None] * HEAD_DIM + d[None, :], out, mask=out_mask)
            merge_splits_if_last(PART_O, PART_LSE, COUNTERS + b * NUM_KV_HEADS + kv_head, attn_ptrs, part,
                                 row_mask, d, out_mask, NUM_SPLITS, HEAD_DIM, GROUP_PAD, D_PAD)


@triton.jit(do_not_specialize=["M", "stride_tb"])   # batch and table width vary: one variant per M bucket
def decode_layer_kernel(
    # activations [M, H]: the layer's input, its residual input, r1 (scratch), r2 (the residual output), out
    X, RES, R1, R2, OUT, stride_m,
    # weights
    IN_NORM_W, POST_NORM_W, W_QKV, W_O, W_GU, W_DOWN, QW, KW,
    # scratch: qkv [M, QKV_N], attn [M, Hq * D], act [M, I] (model dtype, rows of their width); fp32 partials
    QKV, ATTN, ACT, PART_O, PART_LSE, PART_GEMM,
    # int32 counters, all 0 on entry and on exit: grid barrier [2], merge [M_PAD * Hkv], o / down column blocks
    SYNC, MERGE_COUNTERS, O_COUNTERS, DOWN_COUNTERS,
    # paged KV cache and the step's decode metadata
    K, V, BLOCK_TABLES, SEQ_LENS, POS, SLOTS, COS_SIN, K_SCALE, V_SCALE,
    TIMES, M, eps, qk_eps, qk_scale,
    stride_tb, stride_cos, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ksh, stride_ksd, stride_vsh, stride_vsd,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr,
    COMPUTE: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr, HAS_QK_NORM: tl.constexpr, FP8_MAX: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, M_PAD: tl.constexpr, USE_DOT: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr, SPLIT_O: tl.constexpr,
    BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_DOWN: tl.constexpr, BK_DOWN: tl.constexpr,
    SPLIT_DOWN: tl.constexpr, NUM_STAGES: tl.constexpr, PREFETCH: tl.constexpr, LINES_QKV: tl.constexpr,
    LINES_O: tl.constexpr, LINES_GU: tl.constexpr, LINES_DOWN: tl.constexpr, USE_PDL: tl.constexpr,
    TIMED: tl.constexpr, RSTD_BLOCK: tl.constexpr, U_QKV: tl.constexpr, U_O: tl.constexpr, U_GU: tl.constexpr,
    U_DOWN: tl.constexpr,
):
    # R1 is X itself when not HAS_RESIDUAL (the first layer: r1 = x). All [M, *] buffers are row-contiguous;
    # X, RES, R1, R2 and OUT share the row stride stride_m.
    # TIMED: int64 TIMES [P, 16] gets each program's timer at the start (0), after the wait (1) and after each
    # phase and barrier (2..10)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    _stamp(TIMES, pid, 0, TIMED)
    QKV_N: tl.constexpr = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    ATTN_N: tl.constexpr = NUM_Q_HEADS * HEAD_DIM
    if PREFETCH:   # weights only: allowed before the wait for the previous kernel (dependent_launch.py)
        _prefetch_phase(W_QKV, HIDDEN, QKV_N, HIDDEN, pid, num_programs, BN_QKV, 1, False, LINES_QKV)
        _prefetch_phase(W_O, ATTN_N, HIDDEN, ATTN_N, pid, num_programs, BN_O, SPLIT_O, False, LINES_O)
        _prefetch_phase(W_GU, HIDDEN, INTER, HIDDEN, pid, num_programs, BN_GU, 1, True, LINES_GU)
        _prefetch_phase(W_DOWN, INTER, HIDDEN, INTER, pid, num_programs, BN_DOWN, SPLIT_DOWN, False, LINES_DOWN)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _stamp(TIMES, pid, 1, TIMED)
    rm = tl.arange(0, M_PAD)
    m_mask = rm < M

    # A: r1 = x (+ residual) (program 0 stores it), qkv = rms_norm(r1) * w_in @ W_qkv^T
    rstd = _row_rstd(X, RES, R1, rm, m_mask, stride_m, stride_m, stride_m, HIDDEN, eps,
                     m_mask & ((rm * 0 + pid) == 0), M_PAD, RSTD_BLOCK, HAS_RESIDUAL)
    _gemm_phase(X, RES, stride_m, IN_NORM_W, rstd, W_QKV, HIDDEN, QKV, QKV_N, QKV, 0, PART_GEMM, O_COUNTERS,
                QKV_N, HIDDEN, pid, num_programs, rm, m_mask, M_PAD, BN_QKV, BK_QKV, 1, USE_DOT, False, True,
                HAS_RESIDUAL, False, DOT_IN_FP32, NUM_STAGES, U_QKV)
    _stamp(TIMES, pid, 2, TIMED)
    _grid_sync(SYNC, num_programs)
    _stamp(TIMES, pid, 3, TIMED)

    # B: attention (q/k norm, rotary, the new k / v stored, split attention, the merge) -> attn
    _attention_phase(QKV, QKV_N, K, V, BLOCK_TABLES, stride_tb, SEQ_LENS, POS, SLOTS, COS_SIN, stride_cos, QW, KW,
                     K_SCALE, V_SCALE, ATTN, ATTN_N, PART_O, PART_LSE, MERGE_COUNTERS, M, pid, num_programs,
                     qk_scale, qk_eps, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_vd,
                     stride_ksh, stride_ksd, stride_vsh, stride_vsd, NUM_Q_HEADS, NUM_KV_HEADS,
                     NUM_Q_HEADS // NUM_KV_HEADS, GROUP_PAD, HEAD_DIM, D_PAD, HEAD_DIM // 2, BLOCK_SIZE, TILE,
                     NUM_SPLITS, PRECISION, FP8, COMPUTE, V_TOKEN_MAJOR, HAS_QK_NORM, FP8_MAX)
    _stamp(TIMES, pid, 4, TIMED)
    _grid_sync(SYNC, num_programs)
    _stamp(TIMES, pid, 5, TIMED)

    # C: r2 = attn @ W_o^T + r1
    _gemm_phase(ATTN, ATTN, ATTN_N, IN_NORM_W, rstd, W_O, ATTN_N, R2, stride_m, R1, stride_m, PART_GEMM, O_COUNTERS,
                HIDDEN, ATTN_N, pid, num_programs, rm, m_mask, M_PAD, BN_O, BK_O, SPLIT_O, USE_DOT, False, False,
                False, True, DOT_IN_FP32, NUM_STAGES, U_O)
    _stamp(TIMES, pid, 6, TIMED)
    _grid_sync(SYNC, num_programs)
    _stamp(TIMES, pid, 7, TIMED)

    # D: act = silu(g) * u, [g; u] = rms_norm(r2) * w_post @ W_gate_up^T
    rstd = _row_rstd(R2, R2, R2, rm, m_mask, stride_m, stride_m, stride_m, HIDDEN, eps, m_mask, M_PAD, RSTD_BLOCK,
                     False)
    _gemm_phase(R2, R2, stride_m, POST_NORM_W, rstd, W_GU, HIDDEN, ACT, INTER, ACT, 0, PART_GEMM, O_COUNTERS,
                INTER, HIDDEN, pid, num_programs, rm, m_mask, M_PAD, BN_GU, BK_GU, 1, USE_DOT, True, True, False,
                False, DOT_IN_FP32, NUM_STAGES, U_GU)
    _stamp(TIMES, pid, 8, TIMED)
    _grid_sync(SYNC, num_programs)
    _stamp(TIMES, pid, 9, TIMED)

    # E: out = act @ W_down^T
    _gemm_phase(ACT, ACT, INTER, IN_NORM_W, rstd, W_DOWN, INTER, OUT, stride_m, OUT, 0, PART_GEMM, DOWN_COUNTERS,
                HIDDEN, INTER, pid, num_programs, rm, m_mask, M_PAD, BN_DOWN, BK_DOWN, SPLIT_DOWN, USE_DOT, False,
                False, False, False, DOT_IN_FP32, NUM_STAGES, U_DOWN)
    _stamp(TIMES, pid, 10, TIMED)
