"""Block-wise FP8 weights (128 x 128 blocks, one float32 scale each) and their GEMM.

`quantize_fp8_block(w)` -> (float8_e4m3fn [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)]), the layout of
DeepSeek-V3 / Qwen3-FP8 checkpoints (W ~ W_q * scale_inv per block; scale = block amax / 448, round to nearest).
`fp8_block_gemm(x, w_q, scale_inv, bias)` = x @ W^T with the activations quantized per token per 128-channel
group (W8A8, dynamic): the Triton kernel (nv_kernels.fp8_block_gemm_kernel) on CUDA tensors, else
`fp8_block_gemm_torch`, the same numerics in torch (dequantize, then matmul in fp32): the CPU path and the tests'
reference.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128


def tile_shape(m: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for m rows. BLOCK_N divides GROUP, so a tile never straddles two scale rows;
    decode sizes take narrow tiles so that even N = 4096 spreads over more programs than a GPU has SMs."""
    if m <= 16:
        return 16, 32, 4
    if m <= 64:
        return 64, 64, 4
    return 128, 128, 8


def _pad_to(t: Tensor, rows: int, cols: int) -> Tensor:
    return F.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def quantize_fp8_block(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] (any float dtype) -> (w_q float8_e4m3fn [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)])."""
    n, k = weight.shape
    nb, kb = -(-n // GROUP), -(-k // GROUP)
    blocks = _pad_to(weight.float(), nb * GROUP, kb * GROUP).view(nb, GROUP, kb, GROUP)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX                     # [nb, kb]
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * GROUP, kb * GROUP)[:n, :k].contiguous(), scale


def dequantize_fp8_block(w_q: Tensor, scale_inv: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The inverse: w_q [N, K] * scale_inv per 128 x 128 block -> [N, K] in `dtype`."""
    n, k = w_q.shape
    full = scale_inv.float().repeat_interleave(GROUP, 0).repeat_interleave(GROUP, 1)[:n, :k]
    return (w_q.float() * full).to(dtype)


def quantize_activations_torch(x: Tensor) -> Tensor:
    """x [M, K] -> x rounded through FP8 per token per 128-channel group (scale = group amax / 448), in fp32."""
    m, k = x.shape
    kb = -(-k // GROUP)
    groups = F.pad(x.float(), (0, kb * GROUP - k)).view(m, kb, GROUP)
    scale = groups.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return ((groups / scale).to(FP8_DTYPE).float() * scale).view(m, kb * GROUP)[:, :k]


def fp8_block_gemm_torch(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """Reference: x [..., K] -> [..., N] in x's dtype, the activation rounding of the kernel, fp32 matmul."""
    flat = x.reshape(-1, x.shape[-1])
    y = quantize_activations_torch(flat) @ dequantize_fp8_block(w_q, scale_inv).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], w_q.shape[0])


def fp8_block_gemm_triton(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """The Triton kernel: x [..., K] (bf16 / fp16 / fp32) -> [..., N] in x's dtype."""
    from nv_kernels.fp8_block_gemm_kernel import fp8_block_gemm_kernel  # imported at first use (interpreter tests)

    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m, k = flat.shape
    n = w_q.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, block_n, num_warps = tile_shape(m)
    grid = (-(-m // block_m), -(-n // block_n))
    kernel: Any = fp8_block_gemm_kernel          # launch options (num_warps) are not in the JIT function's type
    kernel[grid](flat, w_q, scale_inv, bias if bias is not None else y, y, m, n, k,
                 flat.stride(0), w_q.stride(0), scale_inv.stride(0), y.stride(0),
                 HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y.view(*x.shape[:-1], n)


def fp8_block_gemm(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ W^T for block-FP8 W: the Triton kernel on CUDA, the torch reference elsewhere (CPU: dequantize+matmul)."""
    if x.is_cuda:
        return fp8_block_gemm_triton(x, w_q, scale_inv, bias)
    return fp8_block_gemm_torch(x, w_q, scale_inv, bias)
