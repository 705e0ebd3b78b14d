"""GGUF "llama" architecture -> HF Llama: tensor names, the q/k row order, and the config.

llama.cpp's converter reorders the rows of q_proj / k_proj inside each head (HF keeps the rotary
halves [x0..x_{D/2-1} | x_{D/2}..x_{D-1}], GGUF interleaves them as pairs (x0, x_{D/2}), (x1, ...)
for its rotate-adjacent rope kernel). `unpermute_qk` undoes that.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

# Per-layer GGUF tensor stem -> HF module path under model.layers.N
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors the HF model does not hold: llama3 rope factors (recomputed from the config).
_SKIPPED = {"rope_freqs.weight"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str) -> str | None:
    """HF name of a GGUF tensor; None for tensors HF does not keep; ValueError for unknown ones."""
    if gguf_name in _SKIPPED:
        return None
    match = _LAYER_RE.match(gguf_name)
    if match is not None:
        layer, stem, kind = match.groups()
        if stem in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[stem]}.{kind}"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in _GLOBAL_NAMES and kind in ("weight", "bias"):
            return f"{_GLOBAL_NAMES[stem]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama equivalent (unsupported tensor in a llama GGUF)")


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation: weight [H*D, ...] (or bias [H*D]) -> HF row order.

    GGUF row (h, i, j) with i < D/2, j in {0, 1} holds HF row (h, j, i): within a head, GGUF
    interleaves the two rotary halves. Viewing rows as [H, D/2, 2] and swapping the last two
    axes back gives HF's [H, 2, D/2].
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads) != 0:
        raise ValueError(f"q/k weight with {rows} rows does not split into {num_heads} heads of even size")
    half = rows // num_heads // 2
    rest = weight.shape[1:]
    return (
        weight.reshape(num_heads, half, 2, *rest)  # [H, D/2, 2, ...] (GGUF order)
        .swapaxes(1, 2)  # [H, 2, D/2, ...] (HF order)
        .reshape(weight.shape)
    )


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """HF row order -> GGUF row order (what llama.cpp's converter does); used to write test files."""
    half = weight.shape[0] // num_heads // 2
    rest = weight.shape[1:]
    return weight.reshape(num_heads, 2, half, *rest).swapaxes(1, 2).reshape(weight.shape)


def fix_tensor(hf_name: str, array: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """Undo the q/k permutation on q_proj / k_proj (weights and biases); other tensors pass through."""
    if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return unpermute_qk(array, int(meta["llama.attention.head_count"]))
    if hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        num_heads = int(meta["llama.attention.head_count"])
        return unpermute_qk(array, int(meta.get("llama.attention.head_count_kv", num_heads)))
    return array


def llama3_rope_scaling(rope_factors: np.ndarray, rope_theta: float, head_dim: int) -> dict[str, Any] | None:
    """Recover HF's llama3 `rope_scaling` from GGUF's precomputed `rope_freqs` divisors.

    llama.cpp stores, per rotary frequency, inv_freq / llama3_inv_freq: 1 for high frequencies,
    `factor` for low ones, and a smooth blend in between (HF `_compute_llama3_parameters`).
    The blend is s = (orig_ctx / wavelen - low) / (high - low), which depends on (orig_ctx, low, high)
    only up to a common scale, so low_freq_factor = 1 (every Llama 3.x release) fixes it.
    Returns None when every divisor is 1; ValueError when the divisors do not fit the llama3 formula.
    """
    factors = np.asarray(rope_factors, dtype=np.float64).reshape(-1)  # [D/2]
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    inv_freq = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / inv_freq
    medium = (factors > 1.0 + 1e-4) & (factors < factor - 1e-4)
    if medium.sum() >= 2:
        smooth = (1.0 / factors[medium] - 1.0 / factor) / (1.0 - 1.0 / factor)
        # smooth = orig/(high-1) * (1/wavelen) - 1/(high-1): a line in 1/wavelen
        slope, intercept = np.polyfit(1.0 / wavelen[medium], smooth, 1)
        high = 1.0 - 1.0 / intercept
        orig = slope * (high - 1.0)
    else:
        # no blended dims: put the boundaries between the last unscaled and first scaled frequency
        first_low = int(np.argmax(factors > 1.0 + 1e-4))
        orig, high = float(wavelen[first_low]) * 0.999, 1.0 + 1e-3
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(round(orig)),
    }
    if not np.allclose(_llama3_divisors(scaling, inv_freq), factors, rtol=1e-3, atol=1e-3):
        raise ValueError("GGUF rope_freqs do not follow the llama3 rope scaling formula; cannot convert")
    return scaling


def _llama3_divisors(scaling: dict[str, Any], inv_freq: np.ndarray) -> np.ndarray:
    """inv_freq / llama3(inv_freq) for `scaling` (the quantity GGUF stores as rope_freqs)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq / scaled


def llama_config(meta: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]],
                 rope_factors: np.ndarray | None):
    """A `transformers.LlamaConfig` from GGUF metadata and the file's tensor names/shapes."""
    from transformers import LlamaConfig

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"llama.{name}", default)

    missing = [k for k in ("block_count", "embedding_length", "attention.head_count") if key(k) is None]
    if missing:
        raise ValueError(f"llama GGUF lacks metadata {', '.join('llama.' + k for k in missing)}")
    hidden = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", key("rope.dimension_count", hidden // num_heads)))
    rope_theta = float(key("rope.freq_base", 10000.0))
    has_bias = {stem: f"blk.0.{stem}.bias" in tensor_shapes for stem in ("attn_q", "attn_output", "ffn_up")}
    if has_bias["attn_q"] != has_bias["attn_output"]:
        raise ValueError("llama GGUF with biases on only some attention projections is not supported")
    # the legacy keywords: every supported transformers takes them (newer ones fold them into rope_parameters)
    rope: dict[str, Any] = {"rope_theta": rope_theta, "rope_scaling": _rope_scaling(meta, rope_factors, rope_theta,
                                                                                   head_dim)}
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=tensor_shapes["token_embd.weight"][0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length", tensor_shapes["blk.0.ffn_up.weight"][0])),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(key("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        **rope,
        max_position_embeddings=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_shapes,
        attention_bias=has_bias["attn_q"],
        mlp_bias=has_bias["ffn_up"],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def _rope_scaling(meta: dict[str, Any], rope_factors: np.ndarray | None, rope_theta: float,
                  head_dim: int) -> dict[str, Any] | None:
    """HF rope_scaling from `llama.rope.scaling.*` metadata (linear, yarn) or llama3 rope_freqs."""
    if rope_factors is not None:
        return llama3_rope_scaling(rope_factors, rope_theta, head_dim)
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind in ("none", ""):
        return None
    factor = float(meta.get("llama.rope.scaling.factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        original = meta.get("llama.rope.scaling.original_context_length")
        scaling = {"rope_type": "yarn", "factor": factor}
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    raise ValueError(f"llama GGUF uses rope scaling type {kind!r}, which nv does not support")
