"""RMSNorm with an optional fused residual add (numerics as HF's Qwen3RMSNorm).

On CUDA one Triton kernel does the add and the norm (nv_kernels.fused_norm); elsewhere torch ops."""
from __future__ import annotations

import torch
from torch import nn

from nv_kernels.fused_dispatch import fused_ops_enabled
from nv_kernels.fused_norm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [..., H]. Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        if fused_ops_enabled(x):
            return rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        summed = x + residual                     # the add in the model dtype, as HF does
        return self._norm(summed), summed
