"""Attention and KV-cache kernels (torch reference, Triton, flash-attn) behind one backend interface,
plus fused elementwise kernels (RMSNorm + residual, q/k-norm + rotary + KV store, SiLU-and-mul)."""
from nv_kernels.__about__ import __version__
from nv_kernels.fused_act import silu_and_mul
from nv_kernels.fused_dispatch import fused_ops, fused_ops_enabled, get_fused_ops, set_fused_ops
from nv_kernels.fused_norm import rms_norm
from nv_kernels.fused_rope import qk_norm_rope
from nv_kernels.interface import AttentionBackend
from nv_kernels.registry import available_backends, get_backend

__all__ = ["AttentionBackend", "__version__", "available_backends", "fused_ops", "fused_ops_enabled",
           "get_backend", "get_fused_ops", "qk_norm_rope", "rms_norm", "set_fused_ops", "silu_and_mul"]
