"""Skinny GEMM for small-batch decode: y[M, N] = x[M, K] @ W[N, K]^T for M <= 16 (the Triton kernel and its
variants: nv_kernels.skinny_gemm_kernel), and `skinny_norm_gemm`, the same GEMM with the add + RMSNorm before
it fused into its prologue. Numerics as torch's path in the model dtype (fp32 accumulation, rounded where
torch rounds); `skinny_gemm_torch` / `skinny_norm_gemm_torch` are the references.

Launch configurations come from nv_kernels.skinny_gemm_config (`choose_config`: the tuned table, else a
heuristic). The layers dispatch here when `skinny_gemm_applies` / `skinny_norm_gemm_applies`;
NV_SKINNY_GEMM=0 (nv_kernels.envs, read at the first dispatch) or `set_skinny_gemm(False)` turns the dispatch
off for A/B runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from nv_kernels import envs
from nv_kernels.dependent_launch import launch_options
from nv_kernels.fused_dispatch import fused_ops_enabled
from nv_kernels.fused_norm import rms_norm_torch
from nv_kernels.skinny_gemm_config import TUNED_CONFIGS, SkinnyGemmConfig, choose_config, m_bucket
from nv_kernels.skinny_gemm_kernel import skinny_gemm_kernel
from nv_kernels.split_k_workspace import SplitKWorkspace

_empty = torch.empty  # tests poison outputs through this hook
WORKSPACE = SplitKWorkspace()                  # split-K partial sums and arrival counters, per device

MAX_M = 16                                     # rows (tokens) the kernels take; more go to cuBLAS
DTYPES = (torch.bfloat16, torch.float16)
_enabled: bool | None = None   # None: neither set nor read yet (the next dispatch reads NV_SKINNY_GEMM)


def skinny_gemm_enabled() -> bool:
    """The dispatch switch: the one `set_skinny_gemm` set, else NV_SKINNY_GEMM (read now, then kept)."""
    global _enabled
    if _enabled is None:
        _enabled = envs.nv_skinny_gemm()
    return _enabled


def set_skinny_gemm(enabled: bool | None) -> bool | None:
    """Turn the layers' dispatch to these kernels on or off; None forgets the setting, so the next dispatch reads
    NV_SKINNY_GEMM again. Returns the previous setting, None when it was neither set nor read yet."""
    global _enabled
    previous, _enabled = _enabled, None if enabled is None else bool(enabled)
    return previous


def _rows_fit(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Switch on, bf16 / fp16 operands of one dtype that match, and 1..MAX_M rows."""
    if not skinny_gemm_enabled() or x.dtype not in DTYPES or weight.dtype != x.dtype:
        return False
    if weight.dim() != 2 or x.dim() < 1:
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (weight.shape[0],)):
        return False
    return 0 < math.prod(x.shape[:-1]) <= MAX_M and x.shape[-1] == weight.shape[1]


def skinny_gemm_applies(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether the layers should call `skinny_gemm` for x [..., K] @ weight [N_w, K]^T (+ bias): the switch
    is on, fused ops run on these tensors (CUDA), all are bf16 / fp16 of one dtype and x has 1..MAX_M rows."""
    if not _rows_fit(x, weight, bias):
        return False
    key = (weight.shape[0], weight.shape[1], m_bucket(math.prod(x.shape[:-1])), False)
    if key in TUNED_CONFIGS and TUNED_CONFIGS[key] is None:
        return False               # torch measured faster at this plain shape
    return fused_ops_enabled(x, weight)


NORM_FUSION_MAX_M = 8
NORM_FUSION_MAX_K = 2048


def skinny_norm_gemm_applies(x: Tensor, residual: Tensor | None, norm_weight: Tensor, weight: Tensor,
                             bias: Tensor | None = None) -> bool:
    """Whether `skinny_norm_gemm` should replace the add + RMSNorm and the GEMM after it: as
    `skinny_gemm_applies`, with a norm weight [K] (and residual like x) of x's dtype. Shapes where torch's
    GEMM measured faster alone still fuse: the fused kernel replaces two launches.
    Only up to NORM_FUSION_MAX_M rows and NORM_FUSION_MAX_K columns: every program computes the row's norm in
    its prologue, and on an H200 that cost more than the saved launch at the Qwen3-8B shape (K 4096: batch 1
    went from 4.83 to 5.03 ms per token) and at 16 rows (batch 16 at the 0.6B shape: 1.76 -> 1.82 ms)."""
    if not _rows_fit(x, weight, bias) or norm_weight.dtype != x.dtype or norm_weight.shape != (x.shape[-1],):
        return False
    if math.prod(x.shape[:-1]) > NORM_FUSION_MAX_M or x.shape[-1] > NORM_FUSION_MAX_K:
        return False
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        return False
    return fused_ops_enabled(x, weight, norm_weight, *(() if residual is None else (residual,)))


def skinny_gemm_torch(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated: bool = False) -> Tensor:
    """The reference: F.linear, then silu(gate) * up when gated."""
    y = F.linear(x, weight, bias)
    if not gated:
        return y
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


def skinny_norm_gemm_torch(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                           bias: Tensor | None = None, *, gated: bool = False) -> tuple[Tensor, Tensor]:
    """The reference: (skinny_gemm_torch(rms_norm(h)), h) with h = x + residual, or x without a residual."""
    if residual is None:   # one tensor back (rms_norm_torch's return type is the union of both forms)
        normed, h = rms_norm_torch(x, norm_weight, eps), x
    else:
        normed, h = rms_norm_torch(x, norm_weight, eps, residual)
    return skinny_gemm_torch(normed, weight, bias, gated=gated), h  # pyright: ignore[reportArgumentType]


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, gated: bool) -> None:
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"skinny_gemm takes bf16 / fp16 x and weight of one dtype, got {x.dtype} and "
                         f"{weight.dtype}")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    if math.prod(x.shape[:-1]) > MAX_M:
        raise ValueError(f"skinny_gemm takes at most {MAX_M} rows, got {math.prod(x.shape[:-1])}")
    if gated and weight.shape[0] % 2:
        raise ValueError(f"a gated weight stacks [gate; up]: its rows must be even, got {weight.shape[0]}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{weight.shape[0]}] of {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")


# Weights above this size are not prefetched: H100 / H200 have 50 MB of L2, and a weight that fills a large
# part of it evicts its own lines before the kernel reads them (Qwen3-8B shape, batch 1: 4.64 ms per token
# with dependent launch and no prefetch, 5.73 ms with its 33-200 MB weights prefetched; Qwen3-0.6B's largest
# weight, gate_up, is 12.6 MB and gains from it).
PREFETCH_MAX_BYTES = 16 << 20


def _prefetch_lines(k_per_split: int, weight: Tensor) -> int:
    """128-byte lines per weight row a program prefetches before it waits (dependent launch): its whole
    K range, up to 64 lines (8 KB of a bf16 row); 0 (no prefetch) when the weight is larger than
    PREFETCH_MAX_BYTES."""
    if weight.numel() * weight.element_size() > PREFETCH_MAX_BYTES:
        return 0
    return min(64, 1 << max(math.ceil(k_per_split / 64) - 1, 0).bit_length())


def _rows(t: Tensor) -> Tensor:
    """t [..., K] as [M, K] with unit stride along K."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def skinny_gemm(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated: bool = False,
                config: SkinnyGemmConfig | None = None) -> Tensor:
    """x [..., K] (at most MAX_M rows) @ weight [N_w, K]^T (+ bias [N_w]) -> [..., N_w], or with gated
    -> silu(gate) * up [..., N_w / 2]. A new tensor; config None: `choose_config`."""
    _check(x, weight, bias, gated)
    return _launch(x, None, None, 0.0, weight, bias, gated, config)[0]


def skinny_norm_gemm(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                     bias: Tensor | None = None, *, gated: bool = False, config: SkinnyGemmConfig | None = None
                     ) -> tuple[Tensor, Tensor]:
    """The add + RMSNorm before a projection fused into its GEMM: h = x + residual (x when residual is None),
    returns (skinny_gemm(rms_norm(h) * norm_weight, weight, bias, gated=gated), h), rounded as
    nv_kernels.fused_norm and `skinny_gemm` round. x, residual [..., K], norm_weight [K]; new tensors."""
    _check(x, weight, bias, gated)
    if norm_weight.shape != (x.shape[-1],) or norm_weight.dtype != x.dtype:
        raise ValueError(f"norm_weight must be [{x.shape[-1]}] of {x.dtype}, got {tuple(norm_weight.shape)} "
                         f"{norm_weight.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs "
                         f"{tuple(x.shape)} {x.dtype}")
    out, h = _launch(x, residual, norm_weight, eps, weight, bias, gated, config)
    return out, (x if h is None else h)


def _launch(x: Tensor, residual: Tensor | None, norm_weight: Tensor | None, eps: float, weight: Tensor,
            bias: Tensor | None, gated: bool, config: SkinnyGemmConfig | None) -> tuple[Tensor, Tensor | None]:
    """(the GEMM's output, x + residual when the norm has a residual). Operands already checked."""
    k, weight_rows = x.shape[-1], weight.shape[0]
    n_out = weight_rows // 2 if gated else weight_rows
    x2 = _rows(x)                                                          # [M, K]
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    m = x2.shape[0]
    out = _empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = out.view(m, n_out)                                              # [M, N]
    h = None if residual is None else _empty(x.shape, dtype=x.dtype, device=x.device)
    if m == 0 or n_out == 0 or k == 0:
        if h is not None and residual is not None:
            h.copy_(x + residual)
        if m and n_out:
            gemm_in = x if norm_weight is None else rms_norm_torch(x if h is None else h, norm_weight, eps)
            out.copy_(skinny_gemm_torch(gemm_in, weight, bias, gated=gated))  # pyright: ignore[reportArgumentType]
        return out, h
    res2 = x2 if residual is None else _rows(residual)                     # [M, K]
    h2 = x2 if h is None else h.view(m, k)
    norm_arg = norm_weight.contiguous() if norm_weight is not None else x2
    cfg = config if config is not None else choose_config(weight_rows, k, m, gated, x.device)
    m_pad = max(16, m_bucket(m)) if cfg.use_dot else m_bucket(m)    # tl.dot takes at least 16 rows
    k_per_split = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
    split_k = math.ceil(k / k_per_split)                                   # no empty splits
    column_blocks = math.ceil(n_out / cfg.block_n)
    bias_arg = bias if bias is not None else x2
    if split_k > 1:   # the rows of MAX_M, so one size per weight shape and split serves every batch
        partials = WORKSPACE.partials(x.device, split_k * MAX_M * weight_rows)[:split_k * m * weight_rows]
        partials = partials.view(split_k, m, weight_rows)                                  # [S, M, N_w]
        counters = WORKSPACE.counters(x.device, column_blocks)
    else:
        partials, counters = x2, x2
    pdl = launch_options(x.device, m)
    # one K tile per program (with the norm: the whole row, which a split would cut): no K loop, the weight tile
    # loaded before the dependent-launch wait (skinny_gemm_kernel's ONE_TILE)
    # DOT_IN_FP32: Triton's interpreter computes tl.dot of bf16 tiles wrongly (numpy has no bf16), so there the
    # dot path upcasts its tiles to fp32 first
    one_tile = k_per_split == cfg.block_k and (norm_weight is None or split_k == 1)
    skinny_gemm_kernel[(column_blocks, split_k)](
        x2, res2, norm_arg, h2, weight, bias_arg, out2, partials, counters, m, n_out, k, k_per_split,
        x2.stride(0), res2.stride(0), h2.stride(0), weight.stride(0), out2.stride(0), partials.stride(-2),
        partials.stride(0), n_out * weight.stride(0), float(eps),
        M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot, GATED=gated,
        HAS_BIAS=bias is not None, HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        SPLIT_K=split_k, EVEN_K=k % cfg.block_k == 0, DOT_IN_FP32=envs.triton_interpret(),
        NUM_STAGES=cfg.num_stages,
        PREFETCH_LINES=_prefetch_lines(k_per_split, weight) if pdl["USE_PDL"] and not one_tile else 0,
        ONE_TILE=one_tile, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl)
    return out, h
