"""Qwen3 and Qwen2 causal LMs built from nv-layers."""
from nv_qwen3.__about__ import __version__

__all__ = ["__version__"]
