"""Block-wise FP8 weights (128 x 128 blocks, one float32 scale each) and their GEMM.

`quantize_fp8_block(w)` -> (float8_e4m3fn [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)]), the layout of
DeepSeek-V3 / Qwen3-FP8 checkpoints (W ~ W_q * scale_inv per block; scale = block amax / 448, round to nearest).
`fp8_block_gemm(x, w_q, scale_inv, bias)` = x @ W^T with the activations quantized per token per 128-channel
group (W8A8, dynamic): on CUDA tensors two Triton kernels, the activations' quantization
(nv_kernels.fp8_act_quant_kernel) and the GEMM on FP8 codes (nv_kernels.fp8_block_gemm_kernel), else
`fp8_block_gemm_torch`, the same numerics in torch (dequantize, then matmul in fp32): the CPU path and the tests'
reference.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128
GROUP_M = 8               # row tiles that sweep the columns together (their x tiles stay in L2)
DEFAULT_SMS = 132         # the launch heuristic's SM count off CUDA (interpreter tests): an H100's / H200's


def tile_shape(m: int, n: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for x [m, K] @ W [n, K]^T on `sms` SMs. BLOCK_N divides GROUP, so
    a tile never straddles two scale rows. Rows: the smallest tile that holds them up to 64, then 128-row tiles
    where those fill the SMs, else 64. Columns: the widest of 128 / 64 / 32 that still fills them (decode batches
    read weights: what matters is that every SM streams some). Filled: programs for at least 70% of the SMs.
    Measured on an H100 at Qwen3-8B's projections and 256 rows: 128 x 128 tiles won for qkv (96 programs) and
    gate_up, 64 x 128 for o and down (where 128 x 128 leaves 64 programs); from 2,048 rows 128 x 128 won everywhere,
    with 8 warps and 3 stages (64-row tiles: 4 warps, 4 stages)."""
    def fills(rows: int, cols: int) -> bool:
        return 10 * -(-m // rows) * -(-n // cols) >= 7 * sms

    if m <= 64:
        block_m = max(16, _next_power_of_2(m))
    else:
        block_m = 128 if fills(128, 128) else 64
    block_n = next((b for b in (128, 64) if fills(block_m, b)), 32)
    return block_m, block_n, 8 if block_m == 128 else 4, 3 if block_m == 128 else 4


def _next_power_of_2(v: int) -> int:
    return 1 << (v - 1).bit_length()


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


def quantize_activations_triton(x: Tensor) -> tuple[Tensor, Tensor]:
    """The Triton kernel (nv_kernels.fp8_act_quant_kernel): x [M, K] -> (codes float8_e4m3fn [M, K], scales float32
    [ceil(K / 128), M]), the rounding of `quantize_activations_torch`."""
    from nv_kernels.fp8_act_quant_kernel import fp8_act_quant_kernel  # imported at first use (interpreter tests)

    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(-(-k // GROUP), m, dtype=torch.float32, device=x.device)
    block_r = 16
    kernel: Any = fp8_act_quant_kernel
    kernel[(-(-m // block_r), -(-k // GROUP))](x, q, scale, m, k, x.stride(0), q.stride(0), scale.stride(0),
                                               BLOCK_R=block_r, num_warps=4)
    return q, scale


class W8A8Launch(NamedTuple):
    """One launch of the GEMM on FP8 codes: tile rows and columns, warps, pipeline stages, and whether a step takes
    two 128-input groups (K a multiple of 256)."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    paired: bool


def choose_launch(m: int, n: int, k: int, sms: int) -> W8A8Launch:
    """The launch fp8_block_gemm_triton takes: `tile_shape`'s tile, two groups a step wherever K allows."""
    return W8A8Launch(*tile_shape(m, n, sms), paired=k % (2 * GROUP) == 0)


def gemm_on_codes(x_q: Tensor, x_scale: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None,
                  out: Tensor, launch: W8A8Launch) -> Tensor:
    """The GEMM kernel alone: quantized x (`quantize_activations_triton`'s codes and scales) @ dequant(W)^T (+ bias)
    into out [M, N], with `launch`."""
    from nv_kernels.fp8_block_gemm_kernel import fp8_block_gemm_kernel  # imported at first use (interpreter tests)

    (m, k), n = x_q.shape, w_q.shape[0]
    grid = (-(-m // launch.block_m) * -(-n // launch.block_n),)
    kernel: Any = fp8_block_gemm_kernel          # launch options (num_warps) are not in the JIT function's type
    kernel[grid](x_q, x_scale, w_q, scale_inv, bias if bias is not None else out, out, m, n, k,
                 x_q.stride(0), x_scale.stride(0), w_q.stride(0), scale_inv.stride(0), out.stride(0),
                 HAS_BIAS=bias is not None, EVEN_K=k % GROUP == 0, BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
                 GROUP_M=GROUP_M, PAIRED=launch.paired, num_warps=launch.num_warps, num_stages=launch.num_stages)
    return out


def fp8_block_gemm_triton(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """The Triton kernels: x [..., K] (bf16 / fp16 / fp32) -> [..., N] in x's dtype. The activations are quantized
    once, then the GEMM runs on FP8 codes."""
    from nv_kernels.sm_count import cuda_sm_count

    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m, k = flat.shape
    n = w_q.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    x_q, x_scale = quantize_activations_triton(flat)
    launch = choose_launch(m, n, k, cuda_sm_count(x.device) or DEFAULT_SMS)
    return gemm_on_codes(x_q, x_scale, w_q, scale_inv, bias, y, launch).view(*x.shape[:-1], n)


def fp8_block_gemm(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ W^T for block-FP8 W: the Triton kernel on CUDA, the torch reference elsewhere (CPU: dequantize+matmul)."""
    if x.is_cuda:
        return fp8_block_gemm_triton(x, w_q, scale_inv, bias)
    return fp8_block_gemm_torch(x, w_q, scale_inv, bias)
