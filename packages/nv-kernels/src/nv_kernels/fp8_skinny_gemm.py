"""The skinny GEMM for block-FP8 weights at decode batch sizes: y[M, N] = x[M, K] @ dequant(W_q)[N, K]^T for
M <= 16, W8A16 (the Triton kernel: nv_kernels.fp8_skinny_gemm_kernel).

W_q is float8_e4m3fn [N_w, K] with scale_inv fp32 [ceil(N_w / 128), ceil(K / 128)] (nv_kernels.fp8_block_gemm's
layout). x stays in the model dtype: a decode step's GEMM is bound by reading W, which FP8 halves, and
quantizing x as the W8A8 kernel of larger batches does (nv_kernels.fp8_block_gemm) would only add a pass and
rounding. `gated` fuses SiLU-and-mul into a stacked [gate; up] projection, as `skinny_gemm(gated=True)` does.
Numerics: fp32 accumulation of x * (code * scale), the result (plus bias) rounded to the model dtype where torch
rounds (`fp8_skinny_gemm_torch`, the reference: dequantize to fp32, then `skinny_gemm_torch`).

The layers dispatch here when `fp8_skinny_gemm_applies` (CUDA, the skinny switch on: `set_skinny_gemm` /
NV_SKINNY_GEMM); launch configurations come from nv_kernels.fp8_skinny_gemm_config. Split-K uses the bf16 skinny
GEMM's workspace (one stream per device: the two never run at once).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from nv_kernels import envs
from nv_kernels.dependent_launch import launch_options
from nv_kernels.fp8_block_gemm import FP8_DTYPE, GROUP, dequantize_fp8_block
from nv_kernels.fp8_skinny_gemm_config import choose_fp8_config, fit_to_scale_blocks
from nv_kernels.fp8_skinny_gemm_kernel import fp8_skinny_gemm_kernel
from nv_kernels.fused_dispatch import fused_ops_enabled
from nv_kernels.skinny_gemm import DTYPES, MAX_M, WORKSPACE, skinny_gemm_enabled, skinny_gemm_torch
from nv_kernels.skinny_gemm_config import SkinnyGemmConfig, m_bucket

_empty = torch.empty  # tests poison outputs through this hook


def _scales_fit(w_q: Tensor, scale_inv: Tensor) -> bool:
    blocks = (-(-w_q.shape[0] // GROUP), -(-w_q.shape[1] // GROUP))
    return scale_inv.dtype == torch.float32 and scale_inv.dim() == 2 and tuple(scale_inv.shape) == blocks


def fp8_skinny_gemm_applies(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None) -> bool:
    """Whether the layers should call `fp8_skinny_gemm` for x [..., K] @ dequant(w_q [N_w, K])^T (+ bias): the
    skinny switch is on, fused ops run on these tensors (CUDA), x is bf16 / fp16 with 1..MAX_M rows, w_q e4m3
    with its block scales, bias (if any) of x's dtype."""
    if not skinny_gemm_enabled() or x.dtype not in DTYPES or w_q.dtype != FP8_DTYPE or w_q.dim() != 2:
        return False
    if x.dim() < 1 or x.shape[-1] != w_q.shape[1] or not _scales_fit(w_q, scale_inv):
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (w_q.shape[0],)):
        return False
    if not 0 < math.prod(x.shape[:-1]) <= MAX_M:
        return False
    return fused_ops_enabled(x, w_q, scale_inv)


def fp8_skinny_gemm_torch(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None, *,
                          gated: bool = False) -> Tensor:
    """The reference: x [..., K] in fp32 times the fp32-dequantized weight, then as `skinny_gemm_torch`
    (bias, and silu(gate) * up when gated), rounded to x's dtype once at the end."""
    y = skinny_gemm_torch(x.float(), dequantize_fp8_block(w_q, scale_inv), None if bias is None else bias.float(),
                          gated=gated)
    return y.to(x.dtype)


def _check(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None, gated: bool) -> None:
    if x.dtype not in DTYPES or w_q.dtype != FP8_DTYPE:
        raise ValueError(f"fp8_skinny_gemm takes bf16 / fp16 x and a float8_e4m3fn weight, got {x.dtype} and "
                         f"{w_q.dtype}")
    if w_q.dim() != 2 or x.dim() < 1 or x.shape[-1] != w_q.shape[1]:
        raise ValueError(f"fp8_skinny_gemm: x {tuple(x.shape)} does not match weight {tuple(w_q.shape)}")
    if not _scales_fit(w_q, scale_inv):
        raise ValueError(f"fp8_skinny_gemm: scale_inv must be float32 [ceil(N/128), ceil(K/128)] for weight "
                         f"{tuple(w_q.shape)}, got {scale_inv.dtype} {tuple(scale_inv.shape)}")
    if math.prod(x.shape[:-1]) > MAX_M:
        raise ValueError(f"fp8_skinny_gemm takes at most {MAX_M} rows, got {math.prod(x.shape[:-1])}")
    if gated and w_q.shape[0] % 2:
        raise ValueError(f"a gated weight stacks [gate; up]: its rows must be even, got {w_q.shape[0]}")
    if bias is not None and (bias.shape != (w_q.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{w_q.shape[0]}] of {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")


def fp8_skinny_gemm(x: Tensor, w_q: Tensor, scale_inv: Tensor, bias: Tensor | None = None, *,
                    gated: bool = False, config: SkinnyGemmConfig | None = None) -> Tensor:
    """x [..., K] (at most MAX_M rows, bf16 / fp16) @ dequant(w_q [N_w, K], scale_inv)^T (+ bias [N_w]) ->
    [..., N_w] in x's dtype, or with gated -> silu(gate) * up [..., N_w / 2]. A new tensor; config None:
    `choose_fp8_config` (a given config is fitted to the scale blocks as well)."""
    _check(x, w_q, scale_inv, bias, gated)
    k, weight_rows = x.shape[-1], w_q.shape[0]
    n_out = weight_rows // 2 if gated else weight_rows
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if w_q.stride(1) != 1:
        w_q = w_q.contiguous()
    scale_inv = scale_inv.contiguous()
    m = x2.shape[0]
    out = _empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = out.view(m, n_out)                                              # [M, N]
    if m == 0 or n_out == 0 or k == 0:
        if m and n_out:
            out.copy_(fp8_skinny_gemm_torch(x, w_q, scale_inv, bias, gated=gated))
        return out
    cfg = choose_fp8_config(weight_rows, k, m, gated, x.device) if config is None else \
        fit_to_scale_blocks(config, n_out, gated)
    m_pad = max(8, m_bucket(m)) if cfg.use_dot else m_bucket(m)            # x^T: the MMA's 8-column side
    k_per_split = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
    split_k = math.ceil(k / k_per_split)                                   # no empty splits
    column_blocks = math.ceil(n_out / cfg.block_n)
    if split_k > 1:   # sized for MAX_M rows, so one size per weight shape and split serves every batch
        partials = WORKSPACE.partials(x.device, split_k * MAX_M * weight_rows)[:split_k * m * weight_rows]
        partials = partials.view(split_k, m, weight_rows)                                  # [S, M, N_w]
        counters = WORKSPACE.counters(x.device, column_blocks)
    else:
        partials, counters = out2, out2
    fp8_skinny_gemm_kernel[(column_blocks, split_k)](
        x2, w_q, scale_inv, bias if bias is not None else out2, out2, partials, counters, m, n_out, k, k_per_split,
        x2.stride(0), w_q.stride(0), scale_inv.stride(0), out2.stride(0), partials.stride(-2), partials.stride(0),
        n_out * w_q.stride(0),
        M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot, GATED=gated,
        HAS_BIAS=bias is not None, SPLIT_K=split_k, EVEN_K=k % cfg.block_k == 0,
        DOT_IN_FP32=envs.triton_interpret(), NUM_STAGES=cfg.num_stages, ONE_TILE=k_per_split == cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(x.device, m))
    return out
