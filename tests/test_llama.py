"""nv_llama.LlamaForCausalLM over a paged KV cache gives HF transformers' logits (CPU, fp32, 1e-4).

Tiny random Llama checkpoints written here: GQA with llama3 rope scaling (every frequency band of
the llama3 formula is hit at head_dim 16), untied; and tied embeddings with attention and MLP biases
with linear rope scaling.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
from transformers import LlamaForCausalLM as HFLlama

from nv_kernels import get_backend
from nv_layers import load_safetensors
from nv_layers.testing import PagedDriver
from nv_llama import LlamaForCausalLM

TOL = 1e-4
VOCAB = 256
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
VARIANTS = {
    "llama3_rope_untied": dict(rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
    "tied_biases_linear_rope": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True,
                                    attention_bias=True, mlp_bias=True, num_key_value_heads=1),
}


def write_tiny_llama(out_dir: Path, seed: int = 0, **overrides) -> Path:
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.1,
                  architectures=["LlamaForCausalLM"], bos_token_id=1, eos_token_id=2)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = HFLlama(LlamaConfig(**kwargs)).float().eval()
    with torch.no_grad():  # HF inits norms to 1 and biases to 0: randomise so misloads show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny_llama_dir(request, tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp(request.param), **VARIANTS[request.param])


def load_nv(path: Path) -> LlamaForCausalLM:
    model = LlamaForCausalLM(AutoConfig.from_pretrained(path)).eval()
    load_safetensors(model, path)
    return model


def test_paged_prefill_and_decode_match_hf_logits(tiny_llama_dir: Path) -> None:
    model = load_nv(tiny_llama_dir)
    driver = PagedDriver(model, num_blocks=64, block_size=4, backend=get_backend("torch"))
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (7, 70, 13)]
    for i, tokens in enumerate(seqs):
        driver.add(i, tokens)
    got: list[tuple[int, int, torch.Tensor]] = []
    logits = driver.step([(0, 7), (1, 40), (2, 13)])       # sequence 1 is chunked: 40 + 30
    got += [(0, 6, logits[0]), (2, 12, logits[1])]
    driver.append(0, int(logits[0].argmax()))
    driver.append(2, int(logits[1].argmax()))
    logits = driver.step([(0, 1), (1, 30), (2, 1)])
    got += [(0, 7, logits[0]), (1, 69, logits[1]), (2, 13, logits[2])]
    for i in range(3):
        driver.append(i, int(logits[i].argmax()))
    for step in range(3):
        logits = driver.step([(i, 1) for i in range(3)])
        for i in range(3):
            got.append((i, len(driver.seqs[i].tokens) - 1, logits[i]))
            driver.append(i, int(logits[i].argmax()))
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        refs = [hf(torch.tensor([driver.seqs[i].tokens])).logits[0] for i in range(3)]
    err = max((row - refs[seq][pos]).abs().max().item() for seq, pos, row in got)
    assert err < TOL


def test_config_flags_shape_the_model(tiny_llama_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_llama_dir)
    model = LlamaForCausalLM(config)
    names = {n for n, _ in model.named_parameters()}
    layer = "model.layers.0."
    assert (layer + "self_attn.qkv_proj.bias" in names) == config.attention_bias
    assert (layer + "self_attn.o_proj.bias" in names) == config.attention_bias
    assert (layer + "mlp.gate_up_proj.bias" in names) == config.mlp_bias
    assert (layer + "mlp.down_proj.bias" in names) == config.mlp_bias
    assert not any("q_norm" in n or "k_norm" in n for n in names)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == config.tie_word_embeddings


def test_unsupported_config_is_a_value_error() -> None:
    base = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaForCausalLM(LlamaConfig(hidden_act="gelu", **base))
    with pytest.raises(ValueError, match="rope type"):
        LlamaForCausalLM(LlamaConfig(rope_scaling={"rope_type": "longrope", "factor": 2.0,
                                                   "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}, **base))


def test_engine_registry_finds_llama() -> None:
    from nv_engine.registry import get_model_class

    assert get_model_class(LlamaConfig(architectures=["LlamaForCausalLM"])) is LlamaForCausalLM
