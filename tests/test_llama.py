"""nv_llama.LlamaForCausalLM through LLM.generate gives HF transformers' tokens and logprobs (CPU, fp32, 1e-4).

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


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and never stalls on a busy CPU
    yield
    torch.set_num_threads(before)


def test_llm_greedy_and_logprobs_match_hf(tiny_llama_dir: Path) -> None:
    """LLM.generate with chunked prefill (32-token budget), 4-token blocks and a prefix-cache hit."""
    from nv_engine import LLM, SamplingParams

    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (7, 70, 13)]
    prompts.append(prompts[1][:40] + [5, 6, 7])             # shares ten 4-token blocks with prompt 1
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=5)
    with LLM(str(tiny_llama_dir), device="cpu", dtype="float32", block_size=4, max_num_batched_tokens=32,
             num_gpu_blocks_override=128) as llm:
        outputs = llm.generate(prompts[:3], params, use_tqdm=False)
        outputs += llm.generate(prompts[3:], params, use_tqdm=False)
    assert outputs[3].num_cached_tokens == 40
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    err = 0.0
    for prompt, out in zip(prompts, outputs, strict=True):
        tokens = out.outputs[0].token_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1], -1)
        assert tokens == logprobs.argmax(-1).tolist()                      # HF's greedy choice at every step
        for step, top in enumerate(out.outputs[0].logprobs):
            err = max(err, max(abs(lp.logprob - logprobs[step, tok].item()) for tok, lp in top.items()))
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
    from nv_engine.model_loader.registry import get_model_class

    assert get_model_class(LlamaConfig(architectures=["LlamaForCausalLM"])) is LlamaForCausalLM
