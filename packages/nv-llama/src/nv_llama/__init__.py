"""Llama-family causal LMs (Llama 2/3/3.x, SmolLM2, ...) built from nv-layers."""
from nv_llama.__about__ import __version__
from nv_llama.model import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "__version__"]
