"""Tiny random HF checkpoints written offline with transformers (the fixtures of tests/conftest.py and
packages/nv-engine/tests/conftest.py use it; see tests/conftest.py for what a checkpoint holds)."""
from __future__ import annotations

import json
from pathlib import Path

TINY_DEFAULTS = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rms_norm_eps=1e-6, initializer_range=0.1, bos_token_id=None,
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
    "Paged attention stores keys and values in fixed-size blocks.",
    "def main():\n    print('hello')\n", "1 2 3 4 5 6 7 8 9 10", "Tensor parallel layers split weights.",
] * 4


def _build_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from nv_engine.model_loader.random_model import write_tokenizer

    write_tokenizer(out_dir, vocab_size - 16, corpus=_CORPUS)   # 16 ids to spare


def write_tiny_checkpoint(out_dir: Path, arch: str, seed: int, max_shard_size: str | None,
                      with_tokenizer: bool, overrides: dict) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, not {arch!r}")
    config_cls, model_cls = classes[arch]
    kwargs = dict(TINY_DEFAULTS)
    if arch == "qwen3":
        kwargs["head_dim"] = 16
        kwargs["tie_word_embeddings"] = True
    kwargs.update(overrides)
    if with_tokenizer:
        _build_tokenizer(out_dir, kwargs["vocab_size"])
        tok_cfg = json.loads((out_dir / "tokenizer.json").read_text())
        eos = next(t["id"] for t in tok_cfg["added_tokens"] if t["content"] == "<|endoftext|>")
        kwargs.setdefault("eos_token_id", eos)
        kwargs.setdefault("pad_token_id", eos)
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    save_kwargs = {"safe_serialization": True}
    if max_shard_size:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out_dir, **save_kwargs)
