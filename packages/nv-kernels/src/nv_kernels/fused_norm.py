"""RMSNorm with an optional fused residual add, in one Triton kernel (torch reference beside it).

Numerics follow HF's Qwen3RMSNorm / LlamaRMSNorm exactly: the residual add in the activation dtype
(rounded once, as a torch add of two bf16 tensors), then in fp32 `x * rsqrt(mean(x^2) + eps)`, cast
to the input dtype, times the weight (rounded to promote(input, weight) dtype). The torch path runs
each of those as its own kernel (pow, mean, add, rsqrt, mul, two casts, mul: ~9 launches); the fused
kernel reads x (and the residual) once and writes the output (and the new residual) once.
Only builtins and jit helpers of this module inside the kernels: triton.language's own @jit helpers
(tl.sum, tl.zeros, ...) fail under TRITON_INTERPRET=1 when triton was imported before it was set.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels.fused_dispatch import FLOAT_DTYPES, fused_ops_enabled, next_power_of_2, triton_jit

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

_empty = torch.empty  # tests poison outputs through this hook


@triton_jit
def _add(a, b):
    return a + b


@triton_jit(do_not_specialize=["n_rows"])  # varies every step: one compiled variant for all (jit_watch)
def _rms_norm_kernel(
    X, RES, W, OUT, RES_OUT, n_rows, n_cols, stride_x, stride_r, stride_o, stride_ro, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]
    cols = tl.arange(0, BLOCK_N)                                          # [BLOCK_N]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)            # [ROWS, BLOCK_N]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(RES + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)   # HF: add in the model dtype
        tl.store(RES_OUT + rows[:, None] * stride_ro + cols[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.reduce(x32 * x32, 1, _add) / n_cols                          # [ROWS]
    normed = (x32 * tl.rsqrt(var + eps)[:, None]).to(X.dtype.element_ty)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    out = normed.to(tl.float32) * w[None, :]
    tl.store(OUT + rows[:, None] * stride_o + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


def rms_norm_torch(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None):
    """The reference (nv_layers.RMSNorm's torch path): norm(x) or (norm(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = weight * x32.to(x.dtype)
    return out if residual is None else (out, x)


def _launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps): a tile of at least ~1k elements; ~8 elements (16 B) per thread."""
    block_n = next_power_of_2(n_cols)
    rows = max(1, 1024 // block_n)
    num_warps = max(1, min(16, block_n * rows // 256))
    return block_n, rows, num_warps


def _as_rows(t: Tensor, n_cols: int) -> Tensor:
    rows = t.reshape(-1, n_cols)        # a view when the leading dims merge, else a copy
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None):
    """Triton kernel: x [..., H] (residual alike) -> norm [..., H] (, new residual [..., H]).

    New tensors are returned; the inputs are not written.
    """
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,):
        raise ValueError(f"weight must have shape ({n_cols},), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs "
                         f"{tuple(x.shape)} {x.dtype}")
    x2 = _as_rows(x, n_cols)                                              # [N, H]
    n_rows = x2.shape[0]
    out = _empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    out2 = out.view(-1, n_cols)
    res2 = res_out = res_out2 = x2
    if residual is not None:
        res2 = _as_rows(residual, n_cols)
        res_out = _empty(x.shape, dtype=x.dtype, device=x.device)
        res_out2 = res_out.view(-1, n_cols)
    if n_rows:
        block_n, rows, num_warps = _launch_config(n_cols)
        _rms_norm_kernel[((n_rows + rows - 1) // rows,)](
            x2, res2, weight.contiguous(), out2, res_out2, n_rows, n_cols, x2.stride(0), res2.stride(0),
            out2.stride(0), res_out2.stride(0), float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, ROWS=rows, num_warps=num_warps)
    return out if residual is None else (out, res_out)


def _triton_supports(x: Tensor, weight: Tensor, residual: Tensor | None) -> bool:
    return (x.dtype in FLOAT_DTYPES and weight.dtype in FLOAT_DTYPES and x.dim() >= 1
            and (residual is None or (residual.dtype == x.dtype and residual.shape == x.shape))
            and fused_ops_enabled(x, weight, *(() if residual is None else (residual,))))


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None):
    """norm(x) or (norm(x + residual), x + residual): the Triton kernel on CUDA, torch elsewhere."""
    if _triton_supports(x, weight, residual):
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)
