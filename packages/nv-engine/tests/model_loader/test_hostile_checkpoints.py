"""Checkpoints that lie: a config smaller than the tensors, code the checkpoint asks to run, a cut
GGUF file. Each gets a ValueError that says what is wrong, never a model that loads and misbehaves."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from nv_engine.config.engine_args import EngineArgs
from nv_engine.engine.llm_engine import LLMEngine
from nv_engine.model_loader.model_path import load_hf_config

ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=16)


def _copy_with_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("field, tensor", [("num_attention_heads", "self_attn"), ("intermediate_size", "mlp")])
def test_config_smaller_than_tensors_is_refused(tiny_model_dir: Path, tmp_path: Path, field: str, tensor: str):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    bad = _copy_with_config(tiny_model_dir, tmp_path / "bad", **{field: config[field] // 2})
    with pytest.raises(ValueError, match=rf"checkpoint tensor .*{tensor}.*expected shape .* found"):
        LLMEngine(EngineArgs.from_kwargs(str(bad), **ENGINE_KWARGS).create_engine_config())


def test_checkpoint_code_is_never_run(tiny_model_dir: Path, tmp_path: Path):
    custom = _copy_with_config(tiny_model_dir, tmp_path / "custom",
                               auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    (custom / "configuration_evil.py").write_text("raise SystemExit('checkpoint code ran')\n")
    with pytest.raises(ValueError, match="does not run code from checkpoints"):
        load_hf_config(str(custom))
    unknown = _copy_with_config(tiny_model_dir, tmp_path / "unknown", model_type="evil-model")
    with pytest.raises(ValueError, match="does not run code from checkpoints"):
        load_hf_config(str(unknown))


def test_truncated_gguf_names_the_file(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_writer import write_llama_gguf

    from nv_engine.model_loader.gguf.reader import open_gguf

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,), "lm_head.weight": (64, 32),
              "model.layers.0.input_layernorm.weight": (32,), "model.layers.0.post_attention_layernorm.weight": (32,),
              "model.layers.0.self_attn.q_proj.weight": (32, 32), "model.layers.0.self_attn.k_proj.weight": (16, 32),
              "model.layers.0.self_attn.v_proj.weight": (16, 32), "model.layers.0.self_attn.o_proj.weight": (32, 32),
              "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
              "model.layers.0.mlp.down_proj.weight": (32, 64)}
    gen = torch.Generator().manual_seed(0)
    state_dict = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    path = write_llama_gguf(tmp_path / "full.gguf", config, state_dict)
    data = path.read_bytes()
    for keep in (len(data) - 100, len(data) // 2, 64, 10):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(ValueError, match=rf"{cut.name}.*(truncated|corrupt)"):
            open_gguf(cut)
