"""The FP8-weight skinny GEMM's Triton kernel: y[M, N] = x[M, K] @ dequant(W)[N, K]^T for M <= 16 (W8A16;
nv_kernels.fp8_skinny_gemm launches it).

W is block-FP8 (float8_e4m3fn [N_w, K], one fp32 scale per 128 x 128 block, S [ceil(N_w / 128), ceil(K / 128)]);
x stays in the model dtype: at decode batch sizes the GEMM is bound by streaming W, and W8A16 reads half the
bytes of bf16 weights without the activation-quantization pass (an amax per token per group) that W8A8 needs.
The structure is the bf16 skinny GEMM's (nv_kernels.skinny_gemm_kernel, whose running sums and epilogue this
kernel shares): each program owns BLOCK_N output columns and streams their weight rows along K; SPLIT_K programs per
column block write fp32 partial sums to the shared split-K workspace and the last to arrive reduces them in split
order and resets its counter (CUDA-graph safe, no fill per call).

Dequantization: BLOCK_N divides 128 (and, with GATED, the up offset N), so a tile's rows share one scale row.
On the tensor cores (USE_DOT) a K step is one 128-input scale block (BLOCK_K = 128): the e4m3 codes, widened to
x's dtype (exact), are the MMA's first operand and x^T [BLOCK_K, M_PAD] its second, so the MMA's rows are output
columns and x's few rows are the padded side (M_PAD 8 or 16); the products are exact, summed in fp32, and the step's
one scale multiplies its sums. The weight tile costs a conversion per pair of codes and no register moves, about
3.3 instructions per code on sm_90 against 10 for x as the first operand (x * s rounded to bf16 then, every warp
converting all of x for a 32-column tile). On the CUDA cores the scales of the K lanes, s[k] = S[row, k // 128],
are folded into x (xs = x * s in fp32, [M_PAD, BLOCK_K]) and the codes are widened to fp32 (exact products).

Variants (constexpr) as skinny_gemm_kernel's: USE_DOT (tensor cores, as above) or the CUDA-core multiply-reduce
(the GEMV at M_PAD = 1), GATED (SiLU-and-mul of stacked [gate; up] in the epilogue), HAS_BIAS,
ONE_TILE (one K tile per program, its weight tile and scales loaded before the dependent-launch wait).
The scale block edge, 128, is written out in the kernel.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
# pyright: reportAttributeAccessIssue=false
from __future__ import annotations

from nv_kernels.fused_dispatch import triton_jit
from nv_kernels.skinny_gemm_kernel import _accumulate, _finish, _reduced, _zero_sums
from nv_kernels.split_k_epilogue import split_k_epilogue

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None


@triton_jit
def _zero(M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    """The running sums: [BLOCK_N, M_PAD] on the tensor cores (the weight tile is the first operand), else the
    CUDA-core layouts of skinny_gemm_kernel._zero_sums."""
    if USE_DOT:
        sums = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    else:
        sums = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, False)
    return sums


@triton_jit
def _scales(s_row, k0, k_idx, k_mask, USE_DOT: tl.constexpr):
    """The weight scales of a K step: one scalar on the tensor cores (a step is one 128-input scale block), else
    those of its K lanes [BLOCK_K] (fp32)."""
    if USE_DOT:
        s = tl.load(s_row + k0 // 128)
    else:
        s = tl.load(s_row + k_idx // 128, mask=k_mask, other=0.0)
    return s


@triton_jit
def _add_tile(sums, x, w, s, M_PAD: tl.constexpr, USE_DOT: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """sums += x [M_PAD, BLOCK_K] (model dtype) times the tile w [BLOCK_N, BLOCK_K] (e4m3) times its scales s.
    Tensor cores: the e4m3 codes widened to x's dtype (exact) are the first operand, x^T the second, so the MMA's
    rows are output columns and only x's M_PAD columns are padding; the products are exact and the step's scalar
    scale multiplies the fp32 sums. CUDA cores: x * s in fp32 times the codes widened to fp32 (exact products)."""
    if USE_DOT:
        if DOT_IN_FP32:
            part = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)))
        else:
            part = tl.dot(w.to(x.dtype), tl.trans(x))
        sums += part * s
    else:
        sums = _accumulate(sums, x.to(tl.float32) * s[None, :], w, M_PAD, False, DOT_IN_FP32)
    return sums


@triton_jit
def _result(sums, M_PAD: tl.constexpr, USE_DOT: tl.constexpr):
    """The [M_PAD, BLOCK_N] fp32 result of the running sums."""
    if USE_DOT:
        out = tl.trans(sums)
    else:
        out = _reduced(sums, M_PAD, False)
    return out


@triton_jit(do_not_specialize=["M"])   # the batch size varies; M_PAD is its compile-time bucket
def fp8_skinny_gemm_kernel(
    X, W, S, BIAS, OUT, PART, COUNTERS, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_sn, stride_om,
    stride_pm, stride_ps, up_offset,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr, ONE_TILE: tl.constexpr,
):
    # X [M, K] model dtype, W [N_w, K] e4m3 (N_w = 2N when GATED: the up rows of a column sit N rows, up_offset =
    # N * stride_wn elements, further down), S fp32 [ceil(N_w / 128), ceil(K / 128)], OUT [M, N] model dtype.
    # grid (cdiv(N, BLOCK_N), SPLIT_K); SPLIT_K > 1: PART fp32 [SPLIT_K, M, N_w] and COUNTERS int32 [cdiv(N,
    # BLOCK_N)], all 0 on entry, as skinny_gemm_kernel's.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                          # [BLOCK_N] output columns
    rm = tl.arange(0, M_PAD)                                              # [M_PAD] rows of x
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    s_gate = S + ((pid_n * BLOCK_N) // 128) * stride_sn                   # this tile's scale row (and up's)
    s_up = S + ((N + pid_n * BLOCK_N) // 128) * stride_sn
    w_ptrs = W + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]       # [BLOCK_N, BLOCK_K] at k = 0..
    x_ptrs = X + rm[:, None] * stride_xm + rk[None, :]                    # [M_PAD, BLOCK_K]
    # running sums as skinny_gemm_kernel keeps them (per K lane on the CUDA cores, reduced once after the loop)
    gate_sums = _zero(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    up_sums = _zero(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    if ONE_TILE:   # the weight tile and its scales into registers first: before the dependent-launch wait
        k_idx = k_lo + rk
        k_mask = k_idx < k_hi
        if EVEN_K:   # whole tiles: no K mask, the loads stay 16-byte vectors
            k_mask = rk < BLOCK_K
        w = tl.load(w_ptrs + k_lo, mask=n_mask[:, None] & k_mask[None, :], other=0.0)   # [BLOCK_N, BLOCK_K]
        s = _scales(s_gate, k_lo, k_idx, k_mask, USE_DOT)                              # [BLOCK_K] or one
        w_up = w
        s_u = s
        if GATED:
            w_up = tl.load(w_ptrs + up_offset + k_lo, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            s_u = _scales(s_up, k_lo, k_idx, k_mask, USE_DOT)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x = tl.load(x_ptrs + k_lo, mask=m_mask[:, None] & k_mask[None, :], other=0.0)   # [M_PAD, BLOCK_K]
        gate_sums = _add_tile(gate_sums, x, w, s, M_PAD, USE_DOT, DOT_IN_FP32)
        if GATED:
            up_sums = _add_tile(up_sums, x, w_up, s_u, M_PAD, USE_DOT, DOT_IN_FP32)
    else:
        if USE_PDL:   # launched early: nothing but pointers before the wait
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):  # pyright: ignore[reportGeneralTypeIssues]
            k_idx = k0 + rk
            k_mask = k_idx < k_hi
            if EVEN_K:
                k_mask = rk < BLOCK_K
            w_mask = n_mask[:, None] & k_mask[None, :]
            w = tl.load(w_ptrs + k0, mask=w_mask, other=0.0)                           # [BLOCK_N, BLOCK_K] e4m3
            w_up = w
            if GATED:   # both tiles' loads in flight before either is used
                w_up = tl.load(w_ptrs + up_offset + k0, mask=w_mask, other=0.0)
            x = tl.load(x_ptrs + k0, mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [M_PAD, BLOCK_K]
            s = _scales(s_gate, k0, k_idx, k_mask, USE_DOT)                            # [BLOCK_K] or one
            gate_sums = _add_tile(gate_sums, x, w, s, M_PAD, USE_DOT, DOT_IN_FP32)
            if GATED:
                up_sums = _add_tile(up_sums, x, w_up, _scales(s_up, k0, k_idx, k_mask, USE_DOT), M_PAD, USE_DOT,
                                    DOT_IN_FP32)
    acc = _result(gate_sums, M_PAD, USE_DOT)                              # [M_PAD, BLOCK_N] fp32
    up = acc
    if GATED:
        up = _result(up_sums, M_PAD, USE_DOT)
    mask = m_mask[:, None] & n_mask[None, :]                              # [M_PAD, BLOCK_N]
    out_ptrs = OUT + rm[:, None] * stride_om + rn[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, _finish(acc, up, BIAS, OUT, rn[None, :], n_mask[None, :], N, GATED, HAS_BIAS), mask=mask)
    else:   # partials in PART; the last split of this column block to arrive reduces them and finishes
        part_ptrs = PART + rm[:, None] * stride_pm + rn[None, :]
        split_k_epilogue(acc, up, part_ptrs, out_ptrs, mask, COUNTERS, pid_n, pid_k, stride_ps, N, SPLIT_K, _finish,
                         BIAS, OUT, rn[None, :], n_mask[None, :], GATED, HAS_BIAS)
