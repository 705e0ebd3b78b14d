"""LlamaForCausalLM alone: builds from a LlamaConfig, loads a HF checkpoint, matches HF logits.

One prefill without a KV cache (the profiling path of the forward context), so the test needs only
nv-layers and transformers. Paged prefill/decode comparisons live in the repo's tests/test_llama*.py.
"""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HFLlama

from nv_kernels import get_backend
from nv_layers import forward_context, load_safetensors
from nv_layers.testing import cacheless_prefill_context
from nv_llama import LlamaForCausalLM


@pytest.mark.parametrize("overrides", [
    dict(tie_word_embeddings=True),
    dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
         rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32}),
])
def test_prefill_logits_match_hf(tmp_path, overrides) -> None:
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.1, architectures=["LlamaForCausalLM"], **overrides)
    torch.manual_seed(0)
    hf = HFLlama(config).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = LlamaForCausalLM(config).eval()
    load_safetensors(model, tmp_path)
    ids = torch.randint(0, 128, (9,))
    with torch.no_grad(), forward_context(cacheless_prefill_context([9], get_backend("torch"))):
        logits = model.compute_logits(model(ids, torch.arange(9)))
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_packed_mapping_and_heads() -> None:
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16)
    model = LlamaForCausalLM(config)
    assert model.packed_modules_mapping["k_proj"] == ("qkv_proj", "k")
    attn = model.model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim) == (4, 1, 16)
    assert attn.o_proj.weight.shape == (32, 64)                   # [hidden, heads * head_dim]
