"""The Triton kernel of nv_kernels.fp8_block_gemm: y[M, N] = x[M, K] @ dequant(W)[N, K]^T, W8A8 with block scales.

Layout (DeepSeek-V3 / Qwen3-FP8 block format): W is float8_e4m3fn [N, K] with one float32 scale per 128 x 128
block, w_scale [ceil(N / 128), ceil(K / 128)], so W[n, k] ~ W_q[n, k] * w_scale[n // 128, k // 128]. The
activations are quantized inside the kernel, per token per 128-channel group (scale = amax / 448, as vLLM's
dynamic W8A8 path does), so one K step = one activation group = one weight block column: the FP8 dot product
of a step is rescaled by a_scale[m] * w_scale[n-block] and summed in fp32. BLOCK_K is fixed at 128.
"""
from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = 448.0           # largest finite float8_e4m3fn
GROUP = 128               # quantization block edge (weights) and activation group size


@triton.jit
def _round_to_e4m3_mantissa(v):
    # fp32 -> the nearest value with 3 mantissa bits (ties to even) by integer arithmetic, so the FP8 cast after it
    # is exact: the same codes on the GPU (whose cast rounds so too) and in Triton's interpreter (whose cast does not
    # carry a rounded-up mantissa into the exponent)
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fp8_block_gemm_kernel(x_ptr, w_ptr, w_scale_ptr, bias_ptr, y_ptr, M, N, K,
                          stride_xm, stride_wn, stride_sn, stride_ym,
                          HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); BLOCK_N divides 128, so a tile sits in one weight block row
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 128)
    m_ok, n_ok = rm < M, rn < N
    scale_row = w_scale_ptr + (pid_n * BLOCK_N // 128) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, 128):
        k_ok = (k0 + rk) < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        a_scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12) / 448.0            # [BLOCK_M]
        x_q = _round_to_e4m3_mantissa(x / a_scale[:, None]).to(tl.float8e4nv)
        w_q = tl.load(w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :],
                      mask=n_ok[:, None] & k_ok[None, :], other=0.0)               # [BLOCK_N, 128] fp8
        w_scale = tl.load(scale_row + k0 // 128)
        part = tl.dot(x_q, tl.trans(w_q), out_dtype=tl.float32)
        acc += part * (a_scale[:, None] * w_scale)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])
