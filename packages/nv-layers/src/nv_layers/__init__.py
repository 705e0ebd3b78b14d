"""Tensor-parallel layers, rotary embeddings, the attention layer and the sampler for nv."""
from nv_layers.__about__ import __version__

__all__ = ["__version__"]
