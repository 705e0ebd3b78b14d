"""Llama causal LM (Llama 2 / 3 / 3.x, SmolLM2, Mistral-style configs without sliding window).

Llama is nv_layers' shared pre-norm GQA decoder (nv_layers.decoder) with its layer options: no per-head
q/k RMSNorm, one `attention_bias` flag for q/k/v *and* o_proj, an `mlp_bias` flag for the SwiGLU
projections. Rope scaling (linear, dynamic, yarn, llama3) comes from nv_layers.rotary via the config.
Weight names follow HF's modeling_llama, so HF checkpoints load with `load_safetensors`.
"""
from __future__ import annotations

from typing import Any

from nv_layers.decoder import DecoderForCausalLM, LayerOptions


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama causal LM. forward(input_ids [T], positions [T]) -> hidden [T, H]; compute_logits -> [S, V]."""

    def __init__(self, config: Any) -> None:
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported for Llama (only 'silu')")
        if getattr(config, "sliding_window", None):
            raise ValueError("sliding-window attention (config.sliding_window) is not supported")
        super().__init__(config)

    @classmethod
    def layer_options(cls, config: Any) -> LayerOptions:
        bias = bool(getattr(config, "attention_bias", False))      # HF Llama: one flag for q/k/v and o
        return LayerOptions(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(config, "mlp_bias", False)))
