"""nv_qwen3 model construction, config compatibility, errors and checkpoint loading (CPU, tiny)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen3Config
from transformers import Qwen3ForCausalLM as HFQwen3

import nv_layers.decoder as decoder
from nv_layers import load_safetensors
from nv_layers.decoder_config import read_dims
from nv_qwen3 import PACKED_MODULES_MAPPING, Qwen2ForCausalLM, Qwen3ForCausalLM, get_model_class

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    HFQwen3(Qwen3Config(head_dim=8, **TINY)).save_pretrained(path)
    return path


def test_qwen3_layout_and_tied_head() -> None:
    model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, tie_word_embeddings=True, **TINY))
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 8, 32) and attn.qkv_proj.bias is None
    assert hasattr(attn, "q_norm") and attn.o_proj.bias is None
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.packed_modules_mapping == PACKED_MODULES_MAPPING


def test_qwen3_attention_bias_and_qwen2_layout() -> None:
    q3 = Qwen3ForCausalLM(Qwen3Config(head_dim=8, attention_bias=True, **TINY)).model.layers[0].self_attn
    assert q3.qkv_proj.bias is not None and q3.o_proj.bias is not None
    q2 = Qwen2ForCausalLM(Qwen2Config(**TINY)).model.layers[0].self_attn
    assert q2.qkv_proj.bias is not None and q2.o_proj.bias is None and not hasattr(q2, "q_norm")
    assert q2.head_dim == 32 // 4                                  # Qwen2 has no head_dim: hidden / heads


def test_transformers4_style_config() -> None:
    """Old configs: rope_theta / rope_scaling attributes, no head_dim, no rope_parameters."""
    old = SimpleNamespace(architectures=["Qwen2ForCausalLM"], rope_theta=1e6, rope_scaling=None,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", **TINY)
    dims = read_dims(old)
    assert dims.head_dim == 8 and dims.rope.base == 1e6 and dims.rope.scaling is None
    model = get_model_class(old)(old)
    assert isinstance(model, Qwen2ForCausalLM)


def test_rope_scaling_reaches_the_rotary_table() -> None:
    cfg = Qwen3Config(head_dim=8, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                 "original_max_position_embeddings": 64}, **TINY)
    rope = Qwen3ForCausalLM(cfg).model.layers[0].self_attn.rotary_emb
    assert rope.cos_sin_cache.shape[0] == 128


@pytest.mark.parametrize("tp,heads,kv,match", [(3, 4, 2, "num_attention_heads"),
                                               (4, 8, 3, "num_key_value_heads"),
                                               (5, 5, 5, "intermediate_size")])
def test_tp_divisibility_errors(monkeypatch: pytest.MonkeyPatch, tp: int, heads: int, kv: int, match: str) -> None:
    monkeypatch.setattr(decoder, "get_tp_size", lambda: tp)
    cfg = Qwen3Config(**{**TINY, "num_attention_heads": heads, "num_key_value_heads": kv}, head_dim=8)
    with pytest.raises(ValueError, match=match):
        Qwen3ForCausalLM(cfg)


def test_unsupported_architecture_and_settings() -> None:
    with pytest.raises(ValueError, match="'LlamaForCausalLM' is not supported"):
        get_model_class(SimpleNamespace(architectures=["LlamaForCausalLM"]))
    with pytest.raises(ValueError, match="architectures"):
        get_model_class(SimpleNamespace(architectures=None))
    with pytest.raises(ValueError, match="sliding-window"):
        Qwen3ForCausalLM(Qwen3Config(head_dim=8, use_sliding_window=True, **TINY))
    with pytest.raises(ValueError, match="hidden_act"):
        Qwen3ForCausalLM(Qwen3Config(head_dim=8, hidden_act="gelu", **TINY))


def test_loads_hf_checkpoint_and_reports_bad_names(hf_checkpoint: Path, tmp_path: Path) -> None:
    model = Qwen3ForCausalLM(Qwen3Config.from_pretrained(hf_checkpoint))
    load_safetensors(model, hf_checkpoint)
    tensors = load_file(str(hf_checkpoint / "model.safetensors"))
    torch.testing.assert_close(model.model.layers[0].mlp.gate_up_proj.weight.data[48:],
                               tensors["model.layers.0.mlp.up_proj.weight"])
    del tensors["model.layers.0.self_attn.v_proj.weight"]
    tensors["model.layers.0.self_attn.bogus.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        load_safetensors(model, tmp_path)
    assert "missing weights: model.layers.0.self_attn.v_proj.weight" in str(err.value)
    assert "unexpected weights: model.layers.0.self_attn.bogus.weight" in str(err.value)
