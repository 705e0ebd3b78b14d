"""The Triton kernel of nv_kernels.fp8_block_gemm: y[M, N] = x[M, K] @ dequant(W)[N, K]^T, W8A8 with block scales.

Layout (DeepSeek-V3 / Qwen3-FP8 block format): W is float8_e4m3fn [N, K] with one float32 scale per 128 x 128
block, w_scale [ceil(N / 128), ceil(K / 128)], so W[n, k] ~ W_q[n, k] * w_scale[n // 128, k // 128]. The
activations come quantized (nv_kernels.fp8_act_quant_kernel): codes x_q [M, K] and x_scale [ceil(K / 128), M],
one per token per 128-channel group. So one K step = one activation group = one weight block column: the step's
FP8 dot product (exact products, fp32 sums) is scaled by x_scale[m] * w_scale[n-block] and added to the fp32
accumulator, the promotion DeepSeek-V3's FP8 GEMMs make per block. BLOCK_K is fixed at 128.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp8_block_gemm_kernel(xq_ptr, x_scale_ptr, w_ptr, w_scale_ptr, bias_ptr, y_ptr, M, N, K,
                          stride_xm, stride_xs, stride_wn, stride_sn, stride_ym,
                          HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, PAIRED: tl.constexpr):
    # grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),); BLOCK_N divides 128, so a tile sits in one weight block row.
    # Programs go in groups of GROUP_M row tiles that sweep the columns together: their x tiles stay in L2 while
    # the weight streams past (the grouped order of Triton's matmul tutorial).
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows
    pid_n = (pid % (GROUP_M * tiles_n)) // rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 128)
    # rows and columns past the edge read row / column 0 again (in bounds, no mask in the loop); never stored
    rm_in = tl.where(rm < M, rm, 0)
    rn_in = tl.where(rn < N, rn, 0)
    x_ptrs = xq_ptr + rm_in[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn_in[:, None] * stride_wn + rk[None, :]
    x_scale_ptrs = x_scale_ptr + rm_in
    w_scale_row = w_scale_ptr + (pid_n * BLOCK_N // 128) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PAIRED:
        # two groups a step (the host asks for it where K is a multiple of 256): two dot products, then both
        # promotions. Measured on an H100 at Qwen3-8B's projections from 2,048 rows: 9-13% less time than one group
        # a step (the compiler still waits for each product before the next)
        for group in range(0, tl.cdiv(K, 128), 2):
            x0 = tl.load(x_ptrs)
            w0 = tl.load(w_ptrs)
            x1 = tl.load(x_ptrs + 128)
            w1 = tl.load(w_ptrs + 128)
            part0 = tl.dot(x0, tl.trans(w0), out_dtype=tl.float32)
            part1 = tl.dot(x1, tl.trans(w1), out_dtype=tl.float32)
            x_scale0 = tl.load(x_scale_ptrs + group * stride_xs)
            x_scale1 = tl.load(x_scale_ptrs + (group + 1) * stride_xs)
            w_scale0 = tl.load(w_scale_row + group)
            w_scale1 = tl.load(w_scale_row + group + 1)
            acc += part0 * (x_scale0[:, None] * w_scale0) + part1 * (x_scale1[:, None] * w_scale1)
            x_ptrs += 256
            w_ptrs += 256
    else:
        for group in range(0, tl.cdiv(K, 128)):
            if EVEN_K:
                x = tl.load(x_ptrs)
                w = tl.load(w_ptrs)                                                   # [BLOCK_N, 128] fp8
            else:
                k_ok = (group * 128 + rk) < K
                x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            x_scale = tl.load(x_scale_ptrs + group * stride_xs)                      # [BLOCK_M]
            w_scale = tl.load(w_scale_row + group)
            part = tl.dot(x, tl.trans(w), out_dtype=tl.float32)
            acc += part * (x_scale[:, None] * w_scale)
            x_ptrs += 128
            w_ptrs += 128
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm < M)[:, None] & (rn < N)[None, :])
