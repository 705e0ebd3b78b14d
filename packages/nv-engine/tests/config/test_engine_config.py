"""EngineConfig (resolved from EngineArgs), the architecture registry and model-path resolution."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import DEFAULT_BLOCK_SIZE, resolve_dtype, resolve_max_model_len
from nv_engine.model_loader import registry
from nv_engine.model_loader.model_path import resolve_model_path


def create_config(model_dir, **kwargs):
    return EngineArgs.from_kwargs(str(model_dir), **kwargs).create_engine_config()


def test_defaults_come_from_the_checkpoint(tiny_model_dir):
    config = create_config(tiny_model_dir)
    assert config.model == str(tiny_model_dir.resolve())
    assert config.max_model_len == config.hf_config.max_position_embeddings == 2048
    assert config.dtype == torch.float32 and config.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert config.block_size == DEFAULT_BLOCK_SIZE and config.max_num_seqs == 256
    assert config.max_num_batched_tokens >= config.max_num_seqs
    assert config.max_blocks_per_seq == 2048 // DEFAULT_BLOCK_SIZE
    clone = pickle.loads(pickle.dumps(config))
    assert clone == config or (clone.model, clone.max_model_len) == (config.model, config.max_model_len)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_num_seqs = 3


def test_max_model_len_is_capped_by_the_user_and_the_model(tiny_model_dir):
    assert create_config(tiny_model_dir, max_model_len=100).max_model_len == 100
    assert create_config(tiny_model_dir, max_model_len=10**6).max_model_len == 2048
    with pytest.raises(ValueError, match="max_model_len"):
        resolve_max_model_len(0, object())


def test_dtype_auto_is_the_checkpoint_dtype_on_gpu_and_float32_on_cpu():
    class Cfg:
        dtype = torch.bfloat16

    class Old:
        torch_dtype = "float16"

    assert resolve_dtype("auto", Cfg(), "cpu") == torch.float32
    assert resolve_dtype("auto", Cfg(), "cuda") == torch.bfloat16
    assert resolve_dtype("auto", Old(), "cuda:0") == torch.float16
    assert resolve_dtype("auto", object(), "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", Cfg(), "cpu") == torch.bfloat16
    assert resolve_dtype(torch.float16, Cfg(), "cpu") == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", Cfg(), "cpu")


@pytest.mark.parametrize("field,value", [("max_num_seqs", 0), ("max_num_batched_tokens", -1), ("block_size", 0),
                                         ("gpu_memory_utilization", 0.0), ("tensor_parallel_size", 0),
                                         ("seed", "x"), ("num_gpu_blocks_override", 0), ("device", "tpu")])
def test_bad_values_raise_value_error(tiny_model_dir, field, value):
    with pytest.raises(ValueError, match=field):
        create_config(tiny_model_dir, **{field: value})


def test_unknown_keyword_raises_type_error(tiny_model_dir):
    with pytest.raises(TypeError, match="frobnicate"):
        create_config(tiny_model_dir, frobnicate=True)


def test_registry_builtins_and_unknown_architecture():
    class Cfg:
        architectures = ["Qwen3ForCausalLM"]

    assert registry.get_model_class(Cfg()).__name__ == "Qwen3ForCausalLM"
    Cfg.architectures = ["Qwen2ForCausalLM"]
    assert registry.get_model_class(Cfg()).__name__ == "Qwen2ForCausalLM"
    Cfg.architectures = ["MambaForCausalLM"]
    with pytest.raises(ValueError, match="MambaForCausalLM.*Qwen3ForCausalLM"):
        registry.get_model_class(Cfg())
    Cfg.architectures = []
    with pytest.raises(ValueError, match="architecture"):
        registry.get_model_class(Cfg())


def test_registry_runtime_and_entry_point_models(monkeypatch):
    class Toy:
        pass

    class EntryPoint:
        name = "ToyEPForCausalLM"

        def load(self):
            return Toy

    class Cfg:
        architectures = ["ToyEPForCausalLM"]

    monkeypatch.setattr(registry, "_entry_point_table", lambda: {"ToyEPForCausalLM": EntryPoint()})
    assert registry.get_model_class(Cfg()) is Toy
    assert "ToyEPForCausalLM" in registry.supported_architectures()
    monkeypatch.setitem(registry._REGISTERED, "ToyForCausalLM", Toy)
    Cfg.architectures = ["ToyForCausalLM"]
    assert registry.get_model_class(Cfg()) is Toy


def test_model_path_local_dir_file_and_offline_hub(tiny_model_dir, tmp_path, monkeypatch):
    assert resolve_model_path(tiny_model_dir) == str(tiny_model_dir.resolve())
    not_a_model = tmp_path / "weights.bin"
    not_a_model.write_bytes(b"x")
    with pytest.raises(ValueError, match="file"):
        resolve_model_path(not_a_model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="could not be fetched"):
        resolve_model_path("no-such-org/no-such-model-xyz")
    with pytest.raises(ValueError):
        resolve_model_path("")
