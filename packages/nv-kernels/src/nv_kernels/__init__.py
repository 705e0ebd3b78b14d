"""Attention and KV-cache kernels (torch reference, Triton, flash-attn) behind one backend interface."""
from nv_kernels.__about__ import __version__

__all__ = ["__version__"]
