"""Llama causal LM (Llama 2 / 3 / 3.x, SmolLM2, Mistral-style configs without sliding window).

Llama is the pre-norm GQA decoder that nv_qwen3 already builds, parameterised: no per-head q/k
RMSNorm, one `attention_bias` flag for q/k/v *and* o_proj, and an `mlp_bias` flag for the SwiGLU
projections. Rope scaling (linear, dynamic, yarn, llama3) comes from nv_layers.rotary via the config.
Layout and weight names follow HF's modeling_llama, so HF checkpoints load with `load_safetensors`.
"""
from __future__ import annotations

from typing import Any

from nv_layers.linear import MergedColumnParallelLinear, RowParallelLinear
from nv_qwen3.model import Qwen3ForCausalLM


class LlamaForCausalLM(Qwen3ForCausalLM):
    """Llama causal LM. forward(input_ids [T], positions [T]) -> hidden [T, H]; compute_logits -> [S, V]."""

    qk_norm = False

    def __init__(self, config: Any) -> None:
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported for Llama (only 'silu')")
        if getattr(config, "sliding_window", None):
            raise ValueError("sliding-window attention (config.sliding_window) is not supported")
        super().__init__(config)
        if getattr(config, "mlp_bias", False):
            self._add_mlp_bias()

    @staticmethod
    def _biases(config: Any) -> tuple[bool, bool]:
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias                                               # (qkv, o): HF Llama uses one flag

    def _add_mlp_bias(self) -> None:
        """mlp_bias=True: SwiGLU projections with biases (the shared MLP is built without)."""
        hidden, inter = self.dims.hidden_size, self.dims.intermediate_size
        for layer in self.model.layers:
            layer.mlp.gate_up_proj = MergedColumnParallelLinear(hidden, [inter] * 2, bias=True)
            layer.mlp.down_proj = RowParallelLinear(inter, hidden, bias=True)
