"""Attention and KV-cache kernels (torch reference, Triton, flash-attn) behind one backend interface."""
from nv_kernels.__about__ import __version__
from nv_kernels.interface import AttentionBackend
from nv_kernels.registry import available_backends, get_backend

__all__ = ["AttentionBackend", "__version__", "available_backends", "get_backend"]
