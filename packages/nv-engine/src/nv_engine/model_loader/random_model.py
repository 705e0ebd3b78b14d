"""Random-weight Qwen3 checkpoints in HF format, for the benchmark and for `nv generate` without a model.

Throughput does not depend on weight values, so `nv bench --random-weights --shape qwen3-0.6b`
measures the real shape without a download. Weights are written straight from torch.randn in HF's
parameter names (no HF model is instantiated), norms are 1, and a small byte-level BPE tokenizer
is trained on a few sentences when one is wanted.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from nv_engine import envs

SHAPES: dict[str, dict] = {
    # Qwen/Qwen3-0.6B's config.json (BENCHMARK.md's shape)
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    # Qwen/Qwen3-8B's config.json (the tensor-parallel benchmark's shape)
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False),
    # small enough to run on any CPU in a blink
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello, my name is nv and I generate text.",
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "Paged attention keeps keys and values in blocks of a fixed size.",
    "def main():\n    print('hello world')\n", "0 1 2 3 4 5 6 7 8 9 10 11 12",
] * 8


def nv_cache_dir() -> Path:
    """$XDG_CACHE_HOME/nv, or ~/.cache/nv."""
    return envs.cache_dir()


def qwen3_config(shape: str, dtype: str = "bfloat16", **overrides):
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    kwargs = {**SHAPES[shape], **overrides}
    config = Qwen3Config(**kwargs, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    config.architectures = ["Qwen3ForCausalLM"]
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", dtype)
    return config


def random_qwen3_weights(config, dtype: torch.dtype, seed: int = 0, std: float = 0.02,
                         device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """HF Qwen3 parameter names -> random tensors on the CPU (normal(0, std), norms 1), drawn on `device` (a GPU
    draws an 8B model's in seconds where a CPU takes minutes; the values differ between devices, not between runs)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, inter, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype).cpu()

    weights = {"model.embed_tokens.weight": rand(config.vocab_size, h), "model.norm.weight": torch.ones(h, dtype=dtype)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": torch.ones(d, dtype=dtype),
            p + "self_attn.k_norm.weight": torch.ones(d, dtype=dtype),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype),
        })
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = rand(config.vocab_size, h)
    return weights


def write_tokenizer(out_dir: Path, vocab_size: int, corpus: Sequence[str] = _CORPUS) -> None:
    """A byte-level BPE tokenizer of exactly vocab_size ids trained on `corpus` (ChatML chat template,
    eos id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def write_random_checkpoint(out_dir: str | Path, shape: str = "qwen3-0.6b", *, dtype: str = "bfloat16",
                            seed: int = 0, with_tokenizer: bool = False, std: float = 0.02,
                            device: str | torch.device = "cpu", **overrides) -> Path:
    """Write config.json, generation_config.json, model.safetensors (and a tokenizer) to out_dir, the weights drawn
    on `device` (random_qwen3_weights). Written to a temporary sibling first and renamed, so a reader never sees
    half a checkpoint."""
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    config = qwen3_config(shape, dtype, **overrides)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        config.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "do_sample": False}))
        save_file(random_qwen3_weights(config, _DTYPES[dtype], seed, std, device), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        if with_tokenizer:
            write_tokenizer(tmp, config.vocab_size)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def cached_random_model(shape: str = "tiny", *, dtype: str = "float32", with_tokenizer: bool = True,
                        seed: int = 0) -> tuple[Path, bool]:
    """(path, created): a random checkpoint in the nv cache, written on first use."""
    path = nv_cache_dir() / f"random-qwen3-{shape}-{dtype}-seed{seed}"
    if (path / "model.safetensors").exists() and (path / "config.json").exists():
        return path, False
    write_random_checkpoint(path, shape, dtype=dtype, seed=seed, with_tokenizer=with_tokenizer)
    return path, True
