"""Block-FP8 weights end to end on CPU (tiny Qwen3): a Qwen3-FP8-layout checkpoint and online quantization
(`quantization="fp8"` on the unquantized checkpoint) give greedy outputs within vLLM's check_logprobs_close
(top-5) of the unquantized model, and the two FP8 paths agree token for token (online quantization reproduces
the checkpoint's codes). Unsupported or contradicting quantization settings are ValueErrors."""
from __future__ import annotations

from pathlib import Path

import pytest
from hf_compare import check_logprobs_close, nv_with_logprobs
from quantized_checkpoints import runtime_weight_bytes, write_fp8_block_checkpoint

PROMPTS = ["The quick brown fox", "Hello, world! How", "1 2 3 4 5", "Paged attention stores keys"]
TOP_K = 5


def generate(model: Path, **llm_kwargs) -> list:
    from nv_engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=TOP_K, ignore_eos=True)
    with LLM(str(model), max_model_len=128, **llm_kwargs) as llm:
        return nv_with_logprobs(llm.generate(PROMPTS, params, use_tqdm=False))


@pytest.fixture(scope="module")
def tiny_qwen3_dir(make_tiny_checkpoint) -> Path:
    """Projections of whole 128 x 128 blocks, q, k and v each (as real Qwen3 shapes are), so the fused qkv and
    gate_up layers quantized online cut the same blocks as the checkpoint's separate projections."""
    return make_tiny_checkpoint("qwen3", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                num_key_value_heads=4, head_dim=32)


@pytest.fixture(scope="module")
def fp8_dir(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fp8_block_checkpoint(tiny_qwen3_dir, tmp_path_factory.mktemp("tiny_qwen3_fp8"))


def test_fp8_checkpoint_and_online_fp8_are_close_to_the_unquantized_model(tiny_qwen3_dir: Path,
                                                                           fp8_dir: Path) -> None:
    base = generate(tiny_qwen3_dir)
    from_checkpoint = generate(fp8_dir)
    online = generate(tiny_qwen3_dir, quantization="fp8")
    check_logprobs_close(base, from_checkpoint, "unquantized", "fp8 checkpoint")
    check_logprobs_close(base, online, "unquantized", "online fp8")
    assert [ids for ids, _ in online] == [ids for ids, _ in from_checkpoint]
    assert from_checkpoint != base                                      # the weights did change


def test_the_layers_hold_fp8_weights(fp8_dir: Path) -> None:
    import torch
    from transformers import AutoConfig

    from nv_layers.linear import LinearBase
    from nv_layers.loader import build_model
    from nv_qwen3.model import Qwen3ForCausalLM

    model = build_model(Qwen3ForCausalLM, AutoConfig.from_pretrained(fp8_dir), fp8_dir, quantization="fp8")
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(m.weight.dtype == torch.float8_e4m3fn and m.weight_scale_inv is not None
                           for m in linears)


def test_quantization_settings_that_nv_cannot_honour(tiny_qwen3_dir: Path, fp8_dir: Path,
                                                     tmp_path: Path) -> None:
    from nv_engine import EngineArgs

    with pytest.raises(ValueError, match="quantization='int8' is not supported"):
        EngineArgs(model=str(fp8_dir), quantization="int8")
    with pytest.raises(ValueError, match="quantization='awq' does not match the checkpoint, which is 'fp8'"):
        EngineArgs(model=str(fp8_dir), quantization="awq").create_engine_config()
    assert EngineArgs(model=str(fp8_dir)).create_engine_config().quantization == "fp8"
    assert EngineArgs(model=str(tiny_qwen3_dir)).create_engine_config().quantization is None
    other = write_fp8_block_checkpoint(tiny_qwen3_dir, tmp_path / "bnb", {"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match="quant_method='bitsandbytes'.*block-wise FP8"):
        EngineArgs(model=str(other)).create_engine_config()
    blocks = write_fp8_block_checkpoint(tiny_qwen3_dir, tmp_path / "blocks64",
                                        {"quant_method": "fp8", "weight_block_size": [64, 64]})
    with pytest.raises(ValueError, match="weight_block_size"):
        EngineArgs(model=str(blocks)).create_engine_config()



@pytest.mark.parametrize("source", ["online", "checkpoint"])
def test_the_benchmark_floor_counts_the_fp8_weights_the_model_holds(tiny_qwen3_dir: Path, fp8_dir: Path,
                                                                    source: str) -> None:
    from transformers import AutoConfig

    from nv_engine.entrypoints.bench.throughput import checkpoint_weight_bytes
    from nv_layers.loader import build_model
    from nv_qwen3.model import Qwen3ForCausalLM

    path = tiny_qwen3_dir if source == "online" else fp8_dir
    model = build_model(Qwen3ForCausalLM, AutoConfig.from_pretrained(path), path, quantization="fp8")
    itemsize = model.model.embed_tokens.weight.element_size()
    held = runtime_weight_bytes(model)
    assert checkpoint_weight_bytes(str(path), itemsize, "fp8") == held
    unquantized = build_model(Qwen3ForCausalLM, AutoConfig.from_pretrained(tiny_qwen3_dir), tiny_qwen3_dir)
    assert checkpoint_weight_bytes(str(tiny_qwen3_dir), itemsize) == runtime_weight_bytes(unquantized) > held
