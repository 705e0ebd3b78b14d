"""The Triton kernel that quantizes activations for nv_kernels.fp8_block_gemm: x [M, K] -> float8_e4m3fn codes
[M, K] and one float32 scale per token per 128-channel group (scale = group amax / 448, as vLLM's dynamic W8A8
path does), stored transposed, [ceil(K / 128), M], so that the GEMM reads a tile's row scales of one group
contiguously. Done once per GEMM, not once per column tile of it: quantizing costs ~15 instructions an element,
several times the FP8 tensor-core work the element then takes part in.
"""
from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = 448.0           # largest finite float8_e4m3fn
GROUP = 128               # channels per activation scale (one weight block column)


@triton.jit
def _round_to_e4m3(v):
    # fp32 (|v| <= 448) -> the nearest float8_e4m3fn value (ties to even), still in fp32, so that the FP8 cast after
    # it is exact: the same codes on the GPU and in Triton's interpreter (whose cast neither carries a rounded-up
    # mantissa into the exponent nor rounds subnormals). Normal range: 3 mantissa bits by integer arithmetic;
    # subnormal range (|v| < 2^-6): multiples of 2^-9, by adding and taking away 1.5 * 2^14, whose fp32 ulp is 2^-9
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    subnormal = (v + 24576.0) - 24576.0
    return tl.where(tl.abs(v) < 0.015625, subnormal, bits.to(tl.float32, bitcast=True))


@triton.jit
def fp8_act_quant_kernel(x_ptr, q_ptr, scale_ptr, M, K, stride_xm, stride_qm, stride_sk,
                         BLOCK_R: tl.constexpr):
    # grid: (cdiv(M, BLOCK_R), cdiv(K, 128)); one program: BLOCK_R tokens x one 128-channel group
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    rk = group * 128 + tl.arange(0, 128)
    r_ok = rr < M
    mask = r_ok[:, None] & (rk < K)[None, :]
    x = tl.load(x_ptr + rr[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12) / 448.0                       # [BLOCK_R]
    q = _round_to_e4m3(x / scale[:, None]).to(tl.float8e4nv)
    tl.store(q_ptr + rr[:, None] * stride_qm + rk[None, :], q, mask=mask)
    tl.store(scale_ptr + group * stride_sk + rr, scale, mask=r_ok)
