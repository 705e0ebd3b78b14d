"""Qwen3 and Qwen2 causal LMs built from nv-layers."""
from nv_qwen3.__about__ import __version__
from nv_qwen3.model import PACKED_MODULES_MAPPING, Qwen2ForCausalLM, Qwen3ForCausalLM
from nv_qwen3.registry import MODEL_CLASSES, get_model_class

__all__ = ["MODEL_CLASSES", "PACKED_MODULES_MAPPING", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "__version__",
           "get_model_class"]
