"""SiLU-and-multiply for gated MLPs in one Triton kernel (torch reference beside it).

x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]. Numerics as HF's `act_fn(gate) * up` in the
model dtype: silu in fp32, rounded to the dtype (torch's silu kernel), then the product in fp32,
rounded once more (torch's mul). The torch path is two kernels plus a strided read of each half.
Only builtins inside the kernel (see fused_norm's note on the interpreter).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nv_kernels.fused_dispatch import FLOAT_DTYPES, fused_ops_enabled, next_power_of_2, triton_jit

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

_empty = torch.empty  # tests poison outputs through this hook


@triton_jit
def _silu_and_mul_kernel(X, OUT, n_cols, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)                 # [BLOCK]
    mask = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(X.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (act * up).to(OUT.dtype.element_ty), mask=mask)


def silu_and_mul_torch(x: Tensor) -> Tensor:
    """The reference (nv_layers.SiluAndMul's torch path)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul_triton(x: Tensor, block: int = 1024) -> Tensor:
    """Triton kernel: x [..., 2I] -> [..., I] (a new tensor)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dim of x must be even ([gate | up]), got {x.shape[-1]}")
    n_cols = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * n_cols)                                          # [N, 2I]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = _empty((*x.shape[:-1], n_cols), dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n_cols)                                              # [N, I]
    if x2.shape[0] and n_cols:
        block = min(block, next_power_of_2(n_cols))
        num_warps = max(1, min(8, block // 256))
        _silu_and_mul_kernel[(x2.shape[0], (n_cols + block - 1) // block)](
            x2, out2, n_cols, x2.stride(0), out2.stride(0), BLOCK=block, num_warps=num_warps)
    return out


def silu_and_mul(x: Tensor) -> Tensor:
    """silu(gate) * up: the Triton kernel on CUDA, torch elsewhere."""
    if x.dtype in FLOAT_DTYPES and x.dim() >= 1 and x.shape[-1] % 2 == 0 and fused_ops_enabled(x):
        return silu_and_mul_triton(x)
    return silu_and_mul_torch(x)
