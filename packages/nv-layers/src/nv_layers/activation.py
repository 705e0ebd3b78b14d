"""SiLU-and-multiply for gated MLPs (one Triton kernel on CUDA: nv_kernels.fused_act)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nv_kernels.fused_act import silu_and_mul
from nv_kernels.fused_dispatch import fused_ops_enabled


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]
        if fused_ops_enabled(x):
            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
