"""Write small llama GGUF files from HF tensors, the way llama.cpp's converter lays them out (tests/test_gguf.py).

No tokenizer metadata is written: conversions of these files have weights and config only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nv_engine.model_loader.gguf.llama import permute_qk

_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_tensor_name(hf_name: str) -> str:
    module, _, kind = hf_name.rpartition(".")
    if module in _HF_TO_GGUF_GLOBAL:
        return f"{_HF_TO_GGUF_GLOBAL[module]}.{kind}"
    _, _, rest = module.partition("model.layers.")
    layer, _, sub = rest.partition(".")
    return f"blk.{layer}.{_HF_TO_GGUF_LAYER[sub]}.{kind}"


RawTensor = tuple[np.ndarray, str, tuple[int, ...]]  # (raw bytes array, GGML type name, torch-order shape)


def write_llama_gguf(path: str | Path, config: Any, state_dict: dict[str, Any], *,
                     quant_type: str = "F32", raw_tensors: dict[str, RawTensor] | None = None) -> Path:
    """Write `state_dict` (HF names, torch tensors) of a LlamaConfig model as a llama GGUF.

    2-D weights are stored as `quant_type` (F32, F16, or any type gguf.quants can quantize, e.g. Q8_0);
    1-D tensors stay F32. q/k rows are permuted as llama.cpp does. `raw_tensors` adds extra tensors:
    name -> (raw bytes array, GGML type name, torch-order shape), written as given.
    """
    import gguf

    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    num_heads = config.num_attention_heads
    num_kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(_rope_theta(config)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    qtype = gguf.GGMLQuantizationType[quant_type]
    for hf_name, tensor in state_dict.items():
        if hf_name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue
        array = tensor.detach().float().numpy()
        if ".self_attn.q_proj." in hf_name:
            array = permute_qk(array, num_heads)
        elif ".self_attn.k_proj." in hf_name:
            array = permute_qk(array, num_kv_heads)
        if array.ndim == 1 or quant_type == "F32":
            writer.add_tensor(gguf_tensor_name(hf_name), np.ascontiguousarray(array, dtype=np.float32))
        elif quant_type == "F16":
            writer.add_tensor(gguf_tensor_name(hf_name), array.astype(np.float16))
        else:
            data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
            writer.add_tensor(gguf_tensor_name(hf_name), data, raw_shape=data.shape, raw_dtype=qtype)
    for name, (data, type_name, shape) in (raw_tensors or {}).items():
        raw_type = gguf.GGMLQuantizationType[type_name]
        byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, raw_type)
        writer.add_tensor(name, data.reshape(byte_shape), raw_shape=byte_shape, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _rope_theta(config: Any) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return theta
