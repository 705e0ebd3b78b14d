"""INT4 weights with per-group scales and zero points (W4A16: AWQ / GPTQ checkpoints, 4 bits, groups of 128 inputs)
and their GEMM.

Two layouts:
  canonical  codes uint8 [N, K] (0..15), scales [N, K / 128], zeros uint8 [N, K / 128]: what checkpoint readers
             produce and tensor-parallel loaders cut (rows along the outputs, groups along the inputs), and what
             `quantize_int4` (round to nearest, asymmetric) returns;
  kernel     qweight int32 [N, K / 8] (eight codes a word, interleaved within each group of 128), scales [K / 128, N],
             zeros uint8 [K / 128, N]: `pack_int4_weight` makes it from the canonical one (see
             nv_kernels.int4_gemm_kernel for why).
W[n, k] = (code - zero) * scale, in fp32. `int4_gemm(x, qweight, scales, zeros, bias)` = x @ W^T: the Triton
kernel (dequantization inside it: the weight is read as 4-bit codes) where the fused kernels run (CUDA tensors
unless fused ops are "off"), else `int4_gemm_torch`, dequantize then matmul in fp32: the CPU path and the tests'
reference.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nv_kernels import envs
from nv_kernels.dependent_launch import launch_options
from nv_kernels.fused_dispatch import fused_ops_enabled
from nv_kernels.sm_count import cuda_sm_count
from nv_kernels.split_k_workspace import SplitKWorkspace

GROUP = 128                    # inputs per scale and zero point
MAX_CODE = 15
_SHIFTS = torch.arange(0, 32, 4)   # bit offset of code i in its word
WORKSPACE = SplitKWorkspace()  # split-K partial sums and arrival counters, per device
SPLIT_K_MAX_M = 64             # rows of a launch that may split K (decode batches: one block of rows)
PAIRS_MAX_M = 8                # rows of x the heuristic sends to the pair-dequantizing launch (it takes up to 16)
PAIRS_DTYPES = (torch.bfloat16, torch.float16)
_empty = torch.empty           # tests poison outputs through this hook


class Int4GemmConfig(NamedTuple):
    """A launch of the kernel: tile rows / columns, tensor cores or the GEMV, K splits, warps, pipeline stages, and
    whether the tensor cores take the weight as their first operand with codes dequantized in pairs (the kernel's
    PAIRS: up to 16 rows of bf16 / fp16 x)."""

    block_m: int
    block_n: int
    use_dot: bool
    split_k: int
    num_warps: int
    num_stages: int
    pairs: bool = False


def choose_config(m: int, n: int, k: int, sm_count: int | None, pairs: bool = True,
                  gated: bool = False) -> Int4GemmConfig:
    """The launch for an [m, k] x [k, n] product (sm_count None: 132, an H100). Up to 8 rows where `pairs` (x in
    bf16 / fp16) and not `gated`: the weight as the tensor cores' first operand, 128 columns by x's 8 rows (PAIRS).
    Else one row: the GEMV on 64-column blocks (two rows per thread, so each x element converted serves two). More:
    tensor-core tiles of 16, 64 or 128 rows (the bucket of m) by 64 columns, 128 above 64 rows unless that leaves
    fewer programs than SMs. Up to 64 rows (one row block) K is split until there are about four programs per SM,
    with at least two groups per split. Measured on an H100 at Qwen3-8B's projections: at one row PAIRS takes
    0.84-0.93x of the GEMV's time for qkv, o and down, but 1.18x for the gated gate_up; at 16 rows PAIRS (16-row
    tiles) takes 1.18-1.33x of the 16-row tensor-core tiles' time. benchmarks/bench_int4_gemm.py times the
    alternatives."""
    groups = k // GROUP
    sms = sm_count or 132
    pairs = pairs and not gated and m <= PAIRS_MAX_M
    if pairs:
        block_m, block_n, use_dot, stages = 8, 128, True, 3
    elif m == 1:
        block_m, block_n, use_dot, stages = 1, 64, False, 4
    else:
        block_m = 16 if m <= 16 else 64 if m <= SPLIT_K_MAX_M else 128
        block_n = 128 if block_m == 128 and math.ceil(m / 128) * math.ceil(n / 128) >= sms else 64
        use_dot, stages = True, 3
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    split_k = 1
    if m <= SPLIT_K_MAX_M:
        programs = math.ceil(n / block_n)
        split_k = max(1, min(math.ceil(4 * sms / programs), groups // 2))
        split_k = math.ceil(groups / math.ceil(groups / split_k))      # no empty splits
    return Int4GemmConfig(block_m, block_n, use_dot, split_k, warps, stages, pairs)


def _check_groups(k: int) -> None:
    if k % GROUP:
        raise ValueError(f"INT4 weights take inputs in whole groups of {GROUP}; got {k} inputs")


def quantize_int4(weight: Tensor, scale_dtype: torch.dtype = torch.float16) -> tuple[Tensor, Tensor, Tensor]:
    """weight [N, K] -> canonical (codes uint8 [N, K], scales [N, K / 128] in `scale_dtype`, zeros uint8
    [N, K / 128]): round to nearest with each group's range mapped onto 0..15 (AWQ's zero-point quantizer, without
    its activation-aware scaling). The scale is rounded to `scale_dtype` first and the codes are made with it."""
    n, k = weight.shape
    _check_groups(k)
    groups = weight.float().reshape(n, k // GROUP, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)                          # [N, G]
    scales = ((high - low).clamp(min=1e-5) / MAX_CODE).to(scale_dtype)
    s = scales.float()
    zeros = (-torch.round(low / s)).clamp(0, MAX_CODE)
    codes = (torch.round(groups / s[..., None]) + zeros[..., None]).clamp(0, MAX_CODE)
    return codes.to(torch.uint8).reshape(n, k), scales, zeros.to(torch.uint8)


def dequantize_int4_canonical(codes: Tensor, scales: Tensor, zeros: Tensor, dtype: torch.dtype = torch.float32
                              ) -> Tensor:
    """Canonical codes [N, K], scales / zeros [N, K / 128] -> W [N, K] = (code - zero) * scale (fp32), in `dtype`."""
    n, k = codes.shape
    _check_groups(k)
    w = (codes.float().reshape(n, k // GROUP, GROUP) - zeros.float()[..., None]) * scales.float()[..., None]
    return w.reshape(n, k).to(dtype)


def pack_int4_weight(codes: Tensor, scales: Tensor, zeros: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Canonical (codes [N, K], scales [N, K / 128], zeros [N, K / 128]) -> the kernel's (qweight int32 [N, K / 8]:
    word j of group g holds k = 128 g + 16 i + j at bits 4 i; scales [K / 128, N]; zeros uint8 [K / 128, N]), on
    the codes' device."""
    n, k = codes.shape
    _check_groups(k)
    if scales.shape != (n, k // GROUP) or zeros.shape != (n, k // GROUP):
        raise ValueError(f"INT4 codes {tuple(codes.shape)} need scales and zeros of shape {(n, k // GROUP)}; got "
                         f"{tuple(scales.shape)} and {tuple(zeros.shape)}")
    by_shift = codes.to(torch.int64).reshape(n, k // GROUP, 8, 16)                    # [N, G, i, j]
    shifted = by_shift << _SHIFTS.to(codes.device)[None, None, :, None]
    words = shifted.sum(dim=2).reshape(n, k // 8)                                      # [N, G * 16] in 0 .. 2^32 - 1
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words, scales.t().contiguous(), zeros.to(torch.uint8).t().contiguous()


def unpack_int4_codes(qweight: Tensor) -> Tensor:
    """The kernel's qweight int32 [N, K / 8] -> codes uint8 [N, K]."""
    n, words = qweight.shape
    grouped = qweight.reshape(n, words // 16, 1, 16)                                    # [N, G, 1, j]
    shifts = _SHIFTS.to(device=qweight.device, dtype=torch.int32)[None, None, :, None]
    return ((grouped >> shifts) & MAX_CODE).to(torch.uint8).reshape(n, words * 8)     # [N, G, i, j] -> [N, K]


def dequantize_int4(qweight: Tensor, scales: Tensor, zeros: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The kernel layout -> W [N, K] = (code - zero) * scale (fp32), in `dtype`."""
    return dequantize_int4_canonical(unpack_int4_codes(qweight), scales.t(), zeros.t(), dtype)


def int4_gemm_torch(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor | None = None, *,
                    gated: bool = False) -> Tensor:
    """Reference: x [..., K] -> [..., N] in x's dtype: dequantize, fp32 matmul (+ bias), one rounding; gated: the
    weight is [gate; up] and the result silu(gate) * up [..., N / 2], rounded as nv_kernels.fused_act rounds."""
    flat = x.reshape(-1, x.shape[-1]).float()
    y = flat @ dequantize_int4(qweight, scales, zeros).T
    if bias is not None:
        y = y + bias.float()
    y = y.to(x.dtype)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = (F.silu(gate.float()).to(x.dtype).float() * up.float()).to(x.dtype)
    return y.view(*x.shape[:-1], y.shape[-1])


def int4_gemm_triton(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor | None = None,
                     config: Int4GemmConfig | None = None, *, gated: bool = False) -> Tensor:
    """The Triton kernel: x [..., K] (bf16 / fp16 / fp32) -> [..., N] in x's dtype (gated: silu(gate) * up,
    [..., N / 2]); config None: `choose_config`."""
    from nv_kernels.int4_gemm_kernel import int4_gemm_kernel  # imported at first use (interpreter tests)

    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m, k = flat.shape
    rows = qweight.shape[0]
    _check_groups(k)
    if qweight.shape != (rows, k // 8) or scales.shape != (k // GROUP, rows) or zeros.shape != (k // GROUP, rows):
        raise ValueError(f"int4_gemm: x {tuple(x.shape)} does not match qweight {tuple(qweight.shape)}, scales "
                         f"{tuple(scales.shape)}, zeros {tuple(zeros.shape)}")
    if gated and rows % 2:
        raise ValueError(f"int4_gemm: a gated weight stacks [gate; up]: its rows must be even, got {rows}")
    n = rows // 2 if gated else rows
    y = _empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.view(*x.shape[:-1], n)
    pairs = x.dtype in PAIRS_DTYPES
    cfg = config if config is not None else choose_config(m, n, k, cuda_sm_count(x.device), pairs, gated)
    if cfg.pairs and (not pairs or m > cfg.block_m or cfg.block_m not in (8, 16)):
        raise ValueError(f"int4_gemm: the pairs launch takes one block of 8 or 16 rows of bf16 / fp16 x, got "
                         f"{m} rows of {x.dtype} for a block of {cfg.block_m}")
    if cfg.split_k > 1 and m > cfg.block_m:
        raise ValueError(f"int4_gemm: a split-K launch takes one block of rows ({cfg.block_m}), got {m} rows")
    if not cfg.use_dot and m != 1:
        raise ValueError(f"int4_gemm: the GEMV variant takes one row, got {m}")
    groups = k // GROUP
    groups_per_split = math.ceil(groups / cfg.split_k)
    split_k = math.ceil(groups / groups_per_split)
    column_blocks = math.ceil(n / cfg.block_n)
    if split_k > 1:
        numel = split_k * m * rows
        partials = WORKSPACE.partials(x.device, numel)[:numel].view(split_k, m, rows)
        counters = WORKSPACE.counters(x.device, column_blocks)
    else:
        partials, counters = y, y
    kernel: Any = int4_gemm_kernel          # launch options (num_warps) are not in the JIT function's type
    grid = (column_blocks, split_k, math.ceil(m / cfg.block_m))
    kernel[grid](flat, qweight, scales, zeros, bias if bias is not None else y, y, partials, counters, m, n, k,
                 groups_per_split, split_k, flat.stride(0), qweight.stride(0), scales.stride(0), y.stride(0),
                 partials.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_DOT=cfg.use_dot,
                 SPLIT=split_k > 1, GATED=gated, HAS_BIAS=bias is not None, DOT_IN_FP32=envs.triton_interpret(),
                 NUM_STAGES=cfg.num_stages, PAIRS=cfg.pairs, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                 **launch_options(x.device, m))
    return y.view(*x.shape[:-1], n)


def int4_gemm_fused(x: Tensor, qweight: Tensor) -> bool:
    """Whether `int4_gemm` runs the Triton kernel on these tensors (nv_kernels.fused_dispatch: CUDA tensors unless
    fused ops are "off"; CPU tensors in mode "on" under TRITON_INTERPRET=1); `gated=True` needs it."""
    return fused_ops_enabled(x, qweight)


def int4_gemm(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor | None = None, *,
              gated: bool = False) -> Tensor:
    """x @ W^T for INT4 W in the kernel layout (gated: silu(gate) * up of a [gate; up] weight): the Triton kernel
    where `int4_gemm_fused`, else the torch reference."""
    if int4_gemm_fused(x, qweight):
        return int4_gemm_triton(x, qweight, scales, zeros, bias, gated=gated)
    return int4_gemm_torch(x, qweight, scales, zeros, bias, gated=gated)
