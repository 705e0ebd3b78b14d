"""The shape of a pre-norm GQA decoder (Qwen2/3, Llama) read from a transformers config (4.5x and 5.x names)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nv_layers.rotary import RopeConfig, rope_config_from_hf


@dataclass(frozen=True)
class DecoderDims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    rope: RopeConfig


def _required(config: Any, name: str) -> Any:
    value = getattr(config, name, None)
    if value is None:
        raise ValueError(f"model config has no {name!r}")
    return value


def read_dims(config: Any) -> DecoderDims:
    """DecoderDims from an HF config; ValueError for settings the decoder does not support."""
    if getattr(config, "use_sliding_window", False):
        raise ValueError("sliding-window attention (use_sliding_window=True) is not supported")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")
    num_heads = _required(config, "num_attention_heads")
    hidden = _required(config, "hidden_size")
    return DecoderDims(
        vocab_size=_required(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_required(config, "intermediate_size"),
        num_layers=_required(config, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(config, "head_dim", None) or hidden // num_heads,
        rms_norm_eps=getattr(config, "rms_norm_eps", 1e-6),
        max_position=getattr(config, "max_position_embeddings", None) or 32768,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        rope=rope_config_from_hf(config),
    )


def check_tp(dims: DecoderDims, tp_size: int) -> None:
    """ValueError when the head counts or MLP width cannot be split over tp_size ranks."""
    if dims.num_heads % tp_size != 0:
        raise ValueError(f"num_attention_heads ({dims.num_heads}) is not divisible by the "
                         f"tensor-parallel size ({tp_size})")
    kv = dims.num_kv_heads
    if (kv >= tp_size and kv % tp_size != 0) or (kv < tp_size and tp_size % kv != 0):
        raise ValueError(f"num_key_value_heads ({kv}) and the tensor-parallel size ({tp_size}) must divide "
                         f"one another")
    if dims.intermediate_size % tp_size != 0:
        raise ValueError(f"intermediate_size ({dims.intermediate_size}) is not divisible by the "
                         f"tensor-parallel size ({tp_size})")
