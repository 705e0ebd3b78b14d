"""Qwen3 and Qwen2 causal LMs: nv_layers' shared decoder with their layer options.

Qwen3: per-head RMSNorm on q and k, qkv/o bias = config.attention_bias. Qwen2 / Qwen2.5: qkv bias, no o
bias, no q/k norm. Both: GQA, SwiGLU MLP, tied or untied embeddings.
"""
from __future__ import annotations

from typing import Any

from nv_layers.decoder import PACKED_MODULES_MAPPING, DecoderForCausalLM, LayerOptions


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 causal LM. forward(input_ids [T], positions [T]) -> hidden [T, H]; compute_logits -> [S, V]."""

    @classmethod
    def layer_options(cls, config: Any) -> LayerOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return LayerOptions(qk_norm=True, qkv_bias=bias, o_bias=bias)


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2 / Qwen2.5: q/k/v bias, no o_proj bias, no q/k norm."""

    @classmethod
    def layer_options(cls, config: Any) -> LayerOptions:
        return LayerOptions(qkv_bias=True)


__all__ = ["PACKED_MODULES_MAPPING", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
