"""The skinny GEMM's Triton kernel: y[M, N] = x[M, K] @ W[N, K]^T for M <= 16 (nv_kernels.skinny_gemm launches it).

At decode batch sizes a linear layer is bound by streaming its weight from HBM once; cuBLAS's tiles for
small M reach about a third of the bandwidth on Qwen3-0.6B's projections (H200). Here each program owns
BLOCK_N output columns and streams their weight rows W[BLOCK_N, K] along K (contiguous, 16-byte loads);
x (M x K) is tiny and stays in cache. Shapes with few column blocks (N = 1024, K = 3072) split K over
SPLIT_K programs per block: each writes fp32 partial sums into a persistent workspace and bumps the block's
arrival counter; the last to arrive adds the partials up in split order (deterministic), applies the epilogue
and resets the counter to 0 (one kernel per GEMM, no fill per call: CUDA-graph safe; see split_k_workspace).

Variants (constexpr):
  USE_DOT   M padded to 16 and tl.dot on the tensor cores; else a broadcast multiply-reduce on the CUDA
            cores with M padded to a power of two (for M = 1 the classic GEMV, x broadcast over the tile).
  GATED     the gate_up projection of a SwiGLU MLP with SiLU-and-mul fused: W holds [gate; up] stacked
            (N_w = 2 I rows, as MergedColumnParallelLinear stores them); output column j needs rows j and
            j + I, and out[M, I] = silu(gate) * up.
  HAS_BIAS  y += bias (N_w entries) before the epilogue.
  HAS_NORM  `skinny_norm_gemm`: the add + RMSNorm before the projection in the prologue; every program
            computes its rows' rstd over the full K (x rows are tiny and cache-resident), one program writes
            h = x + residual, and the K tiles are normalised as they are loaded (fused_norm's roundings).
  ONE_TILE  one K tile per program (K_PER_SPLIT == BLOCK_K; with HAS_NORM the tile is the whole row): no
            K loop; the weight tile is loaded into registers first, under dependent launch before the
            wait for the previous kernel, so after the wait only x is read (one round trip, not the loop's).
Numerics as torch's path in the model dtype: fp32 accumulation, the GEMM result (plus bias) rounded to the
dtype; gated: silu in fp32 rounded to the dtype, the product in fp32 rounded once more (nv_kernels.fused_act).

Only builtins and jit helpers of this module (split_k_epilogue's, for the split-K epilogue, imported into it)
inside the kernel: Triton resolves a helper through the kernel's module globals (and see fused_norm's note on the
interpreter).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
# pyright: reportAttributeAccessIssue=false
# (that last one: tl.extra.cuda, which triton exposes at run time only)
from __future__ import annotations

from nv_kernels.fused_dispatch import triton_jit
from nv_kernels.split_k_epilogue import split_k_epilogue

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None


@triton_jit
def _zero_sums(M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    """The running sums of one weight tile: [M_PAD, BLOCK_N] for tl.dot; the CUDA-core paths keep products
    per K lane ([BLOCK_N, BLOCK_K] for the GEMV, [M_PAD, BLOCK_N, BLOCK_K] else) and reduce them once."""
    if USE_DOT:
        sums = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    elif M_PAD == 1:
        sums = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        sums = tl.zeros((M_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
    return sums


@triton_jit
def _accumulate(sums, x, w, M_PAD: tl.constexpr, USE_DOT: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """sums += x [M_PAD, BLOCK_K] times w [BLOCK_N, BLOCK_K] in the layout of _zero_sums."""
    if USE_DOT:
        if DOT_IN_FP32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        sums = tl.dot(x, tl.trans(w), sums)
    elif M_PAD == 1:   # the GEMV: x [1, BLOCK_K] broadcasts over the tile, no 3-D layout to convert to
        sums += w.to(tl.float32) * x.to(tl.float32)
    else:
        sums += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return sums


@triton_jit
def _reduced(sums, M_PAD: tl.constexpr, USE_DOT: tl.constexpr):
    """The [M_PAD, BLOCK_N] fp32 result of _zero_sums / _accumulate sums. tl.sum's own combine function:
    compiled, the reduction tl.sum emits; interpreted, numpy's sum (one of this module would run per element)."""
    if USE_DOT:
        out = sums
    elif M_PAD == 1:
        out = tl.reduce(sums, 1, tl.standard._sum_combine)[None, :]
    else:
        out = tl.reduce(sums, 2, tl.standard._sum_combine)
    return out


@triton_jit
def _row_rstd(X, RES, RES_OUT, rm, m_mask, stride_xm, stride_rm, stride_hm, K, eps, h_mask,
              M_PAD: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The norm prologue: 1 / rms of h = x (+ residual) over the whole row -> [M_PAD] fp32. The rows of
    h_mask [M_PAD] (all rows in one program of the grid, none elsewhere) are also stored to RES_OUT. h is
    rounded to the model dtype before it is squared, as nv_kernels.fused_norm rounds the residual add."""
    rk = tl.arange(0, BLOCK_K)
    squares = tl.zeros((M_PAD, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask = m_mask[:, None] & ((k0 + rk) < K)[None, :]
        h = tl.load(X + rm[:, None] * stride_xm + k0 + rk[None, :], mask=mask, other=0.0)   # [M_PAD, BLOCK_K]
        if HAS_RESIDUAL:
            r = tl.load(RES + rm[:, None] * stride_rm + k0 + rk[None, :], mask=mask, other=0.0)
            h = (h.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
            tl.store(RES_OUT + rm[:, None] * stride_hm + k0 + rk[None, :], h, mask=h_mask[:, None] & mask)
        h32 = h.to(tl.float32)
        squares += h32 * h32
    return tl.rsqrt(tl.reduce(squares, 1, tl.standard._sum_combine) / K + eps)


@triton_jit
def _normed(x, r, norm_w, rstd, HAS_RESIDUAL: tl.constexpr):
    """x tile [M_PAD, BLOCK_K] -> rms_norm(x + r) * norm_w, each step rounded as fused_norm rounds it."""
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    normed = (x.to(tl.float32) * rstd[:, None]).to(x.dtype)
    return (normed.to(tl.float32) * norm_w.to(tl.float32)[None, :]).to(x.dtype)


@triton_jit
def _k_step(gate, up, x_ptrs, r_ptrs, nw_ptrs, rstd, w_ptrs, up_offset, m_mask, n_mask, k0, k_hi,
            M_PAD: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, GATED: tl.constexpr,
            HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """One BLOCK_K step of _rows_times_x at k0 (its running sums gate / up in, updated sums out)."""
    rk = tl.arange(0, BLOCK_K)
    if EVEN_K:   # every step is a whole block: no K mask, the loads stay 16-byte vectors
        x_mask = m_mask[:, None]
        w_mask = n_mask[:, None]
        k_mask = rk < BLOCK_K
    else:
        k_mask = (k0 + rk) < k_hi
        x_mask = m_mask[:, None] & k_mask[None, :]
        w_mask = n_mask[:, None] & k_mask[None, :]
    x = tl.load(x_ptrs + k0, mask=x_mask, other=0.0)                                  # [M_PAD, BLOCK_K]
    w = tl.load(w_ptrs + k0, mask=w_mask, other=0.0)                                  # [BLOCK_N, BLOCK_K]
    if HAS_NORM:
        r = x
        if HAS_RESIDUAL:
            r = tl.load(r_ptrs + k0, mask=x_mask, other=0.0)
        norm_w = tl.load(nw_ptrs + k0, mask=k_mask, other=0.0)                        # [BLOCK_K]
        x = _normed(x, r, norm_w, rstd, HAS_RESIDUAL)
    if GATED:   # both tiles' loads in flight before either is used
        w_up = tl.load(w_ptrs + up_offset + k0, mask=w_mask, other=0.0)
        gate = _accumulate(gate, x, w, M_PAD, USE_DOT, DOT_IN_FP32)
        up = _accumulate(up, x, w_up, M_PAD, USE_DOT, DOT_IN_FP32)
    else:
        gate = _accumulate(gate, x, w, M_PAD, USE_DOT, DOT_IN_FP32)
    return gate, up


@triton_jit
def _rows_times_x(x_ptrs, r_ptrs, nw_ptrs, rstd, w_ptrs, up_offset, m_mask, n_mask, k_lo, k_hi,
                  M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                  GATED: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                  EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr):
    """sum over k in [k_lo, k_hi) of x[m, k] * w[n, k] -> [M_PAD, BLOCK_N] fp32, and with GATED the same
    for the rows up_offset elements further (the up half) in the same loop; else the second result is the
    first. x_ptrs [M_PAD, BLOCK_K] (r_ptrs alike) and w_ptrs [BLOCK_N, BLOCK_K] point at k = 0..BLOCK_K-1
    of their rows, nw_ptrs [BLOCK_K] at the norm weight's. HAS_NORM: x is replaced by
    rms_norm(x (+ r)) * norm_w with the row's rstd [M_PAD]."""
    gate = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    up = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    # num_stages on the loop itself: the weight loads are software-pipelined (cp.async) on every path, not
    # only where they feed tl.dot
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):  # pyright: ignore[reportGeneralTypeIssues]
        gate, up = _k_step(gate, up, x_ptrs, r_ptrs, nw_ptrs, rstd, w_ptrs, up_offset, m_mask, n_mask, k0, k_hi,
                           M_PAD, BLOCK_K, USE_DOT, GATED, HAS_NORM, HAS_RESIDUAL, EVEN_K, DOT_IN_FP32)
    gate_sums = _reduced(gate, M_PAD, USE_DOT)
    up_sums = gate_sums
    if GATED:
        up_sums = _reduced(up, M_PAD, USE_DOT)
    return gate_sums, up_sums


@triton_jit
def _one_tile_sums(w, w_up, X, RES, NORM_W, RES_OUT, rm, m_mask, k_lo, k_hi, K, stride_xm, stride_rm, stride_hm,
                    eps, h_mask, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    USE_DOT: tl.constexpr, GATED: tl.constexpr, HAS_NORM: tl.constexpr,
                    HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """ONE_TILE: x's tile [k_lo, k_hi) times the weight tiles w (and w_up) already in registers -> fp32
    [M_PAD, BLOCK_N] sums (gate, up). HAS_NORM: the tile is the whole row (k_lo 0, k_hi K); h = x (+ residual)
    is rounded, stored by the rows of h_mask, squared for rstd and normed as _row_rstd and _normed do, from
    the one load."""
    rk = k_lo + tl.arange(0, BLOCK_K)
    k_mask = rk < k_hi
    if EVEN_K:
        k_mask = tl.arange(0, BLOCK_K) < BLOCK_K
    mask = m_mask[:, None] & k_mask[None, :]                                       # [M_PAD, BLOCK_K]
    x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0)
    if HAS_NORM:
        if HAS_RESIDUAL:
            r = tl.load(RES + rm[:, None] * stride_rm + rk[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
            tl.store(RES_OUT + rm[:, None] * stride_hm + rk[None, :], x, mask=h_mask[:, None] & mask)
        norm_w = tl.load(NORM_W + rk, mask=k_mask, other=0.0)                  # [BLOCK_K]
        x32 = x.to(tl.float32)
        rstd = tl.rsqrt(tl.reduce(x32 * x32, 1, tl.standard._sum_combine) / K + eps)   # [M_PAD]
        x = _normed(x, x, norm_w, rstd, False)
    gate = _accumulate(_zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT), x, w, M_PAD, USE_DOT, DOT_IN_FP32)
    gate_sums = _reduced(gate, M_PAD, USE_DOT)
    up_sums = gate_sums
    if GATED:
        up = _accumulate(_zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT), x, w_up, M_PAD, USE_DOT, DOT_IN_FP32)
        up_sums = _reduced(up, M_PAD, USE_DOT)
    return gate_sums, up_sums


@triton_jit
def _finish(acc, up, BIAS, OUT, cols, col_mask, N, GATED: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The epilogue on fp32 sums (acc: columns `cols`; up: columns N + cols when GATED) -> OUT's dtype."""
    y = acc
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = y.to(OUT.dtype.element_ty)                                        # the GEMM output, as torch rounds it
    if GATED:
        u = up
        if HAS_BIAS:
            u += tl.load(BIAS + N + cols, mask=col_mask, other=0.0).to(tl.float32)
        u = u.to(OUT.dtype.element_ty).to(tl.float32)
        g = y.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
        y = (act * u).to(OUT.dtype.element_ty)
    return y


@triton_jit
def _prefetch_weights(W, rn, n_mask, k_lo, k_hi, stride_wn, up_offset, N,
                      GATED: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    """Ask L2 for this program's weight rows [k_lo, k_hi) (128-byte lines, every 64th element; addresses
    clamped into the weight) before the wait for the previous kernel: the weight streams from L2 after."""
    rows = tl.minimum(rn, N - 1).to(tl.int64)                                 # [BLOCK_N]
    cols = tl.minimum(k_lo + tl.arange(0, PREFETCH_LINES) * 64, k_hi - 1)     # [LINES]
    ptrs = W + rows[:, None] * stride_wn + cols[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
    if GATED:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs + up_offset],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton_jit(do_not_specialize=["M"])   # the batch size varies; M_PAD is its compile-time bucket
def skinny_gemm_kernel(
    X, RES, NORM_W, RES_OUT, W, BIAS, OUT, PART, COUNTERS, M, N, K, K_PER_SPLIT, stride_xm, stride_rm,
    stride_hm, stride_wn, stride_om, stride_pm, stride_ps, up_offset, eps,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr, ONE_TILE: tl.constexpr = False,
):
    # X [M, K], W [N_w, K] (N_w = 2N when GATED), OUT [M, N] in the model dtype; grid (cdiv(N, BLOCK_N), SPLIT_K).
    # GATED: the up rows of these columns sit N rows (up_offset = N * stride_wn elements) further down.
    # HAS_NORM: the GEMM's input is rms_norm(X (+ RES)) * NORM_W (RES, RES_OUT [M, K]; RES_OUT gets X + RES).
    # SPLIT_K > 1: PART is fp32 [SPLIT_K, M, N_w] (stride_ps between splits) and COUNTERS int32
    # [cdiv(N, BLOCK_N)], all 0 on entry: the last split of a column block to arrive reduces and finishes.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                          # [BLOCK_N] output columns
    rm = tl.arange(0, M_PAD)                                              # [M_PAD] rows of x
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    h_mask = m_mask & ((rm * 0 + pid_n + pid_k) == 0)                     # one program writes x + residual
    if ONE_TILE:   # the weight tile into registers first: under dependent launch while the previous kernel runs
        w_ptrs = W + rn.to(tl.int64)[:, None] * stride_wn + (k_lo + rk)[None, :]       # [BLOCK_N, BLOCK_K]
        if EVEN_K:   # whole tiles: no K mask, the loads stay 16-byte vectors
            w_mask = n_mask[:, None] & (rk < BLOCK_K)[None, :]
        else:
            w_mask = n_mask[:, None] & ((k_lo + rk) < k_hi)[None, :]
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        w_up = w
        if GATED:
            w_up = tl.load(w_ptrs + up_offset, mask=w_mask, other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc, up = _one_tile_sums(w, w_up, X, RES, NORM_W, RES_OUT, rm, m_mask, k_lo, k_hi, K, stride_xm,
                                  stride_rm, stride_hm, eps, h_mask, M_PAD, BLOCK_N, BLOCK_K, USE_DOT, GATED,
                                  HAS_NORM, HAS_RESIDUAL, EVEN_K, DOT_IN_FP32)
    else:
        if USE_PDL:   # launched early (dependent_launch.py): weights into L2, then wait for the previous kernel
            if PREFETCH_LINES > 0:
                _prefetch_weights(W, rn, n_mask, k_lo, k_hi, stride_wn, up_offset, N, GATED, PREFETCH_LINES)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.zeros((M_PAD,), dtype=tl.float32)
        if HAS_NORM:   # one program of the grid writes the new residual stream
            rstd = _row_rstd(X, RES, RES_OUT, rm, m_mask, stride_xm, stride_rm, stride_hm, K, eps, h_mask,
                             M_PAD, BLOCK_K, HAS_RESIDUAL)
        x_ptrs = X + rm[:, None] * stride_xm + rk[None, :]                    # [M_PAD, BLOCK_K]
        r_ptrs = RES + rm[:, None] * stride_rm + rk[None, :]
        w_ptrs = W + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]       # [BLOCK_N, BLOCK_K]
        acc, up = _rows_times_x(x_ptrs, r_ptrs, NORM_W + rk, rstd, w_ptrs, up_offset, m_mask, n_mask, k_lo,
                                k_hi, M_PAD, BLOCK_N, BLOCK_K, USE_DOT, GATED, HAS_NORM, HAS_RESIDUAL, EVEN_K,
                                DOT_IN_FP32, NUM_STAGES)
    mask = m_mask[:, None] & n_mask[None, :]                              # [M_PAD, BLOCK_N]
    out_ptrs = OUT + rm[:, None] * stride_om + rn[None, :]
    if SPLIT_K == 1:
        y = _finish(acc, up, BIAS, OUT, rn[None, :], n_mask[None, :], N, GATED, HAS_BIAS)
        tl.store(out_ptrs, y, mask=mask)
    else:   # partials in PART; the last split of this column block to arrive reduces them and finishes
        part_ptrs = PART + rm[:, None] * stride_pm + rn[None, :]
        split_k_epilogue(acc, up, part_ptrs, out_ptrs, mask, COUNTERS, pid_n, pid_k, stride_ps, N, SPLIT_K, _finish,
                         BIAS, OUT, rn[None, :], n_mask[None, :], GATED, HAS_BIAS)
