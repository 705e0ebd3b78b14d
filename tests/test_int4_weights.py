"""INT4 weights end to end on CPU (tiny Qwen3): AWQ and GPTQ checkpoints (packed as AutoAWQ / AutoGPTQ write them,
tests/int4_checkpoints.py) give greedy outputs within vLLM's check_logprobs_close (top-5) of the unquantized model
they stand for, a float checkpoint holding their dequantized weights (vLLM checks its INT4 kernels so, against HF's
AWQ / GPTQ modules); deliberately broken ones (AWQ codes in plain nibble order, GPTQ scales halved, and the
converse) do not. Against the random model before quantization the rule does not hold at this size: 4-bit codes
move each weight by up to half a step (~10% of its spread), and a tiny random model's next-token distribution is
flat enough that this reorders its top 5. Online `quantization="awq"` on the unquantized checkpoint gives what the
AWQ checkpoint gives, and the Triton kernel inside the engine (interpreted) what the torch path gives. The loaded
layers hold exactly the reference dequantization, also per tensor-parallel shard. Unsupported or contradicting
settings are ValueErrors."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hf_compare import check_logprobs_close, nv_with_logprobs
from int4_checkpoints import (
    AWQ_CONFIG,
    GPTQ_CONFIG,
    reference_weights,
    write_dequantized_checkpoint,
    write_int4_checkpoint,
)
from quantized_checkpoints import runtime_weight_bytes

from nv_layers.linear import LinearBase

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tiny models: one thread, no stalls on a busy machine
PROMPTS = ["The quick brown fox", "Hello, world! How", "1 2 3 4 5", "Paged attention stores keys"]
TOP_K = 5
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def generate(model: Path, **llm_kwargs) -> list:
    from nv_engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=TOP_K, ignore_eos=True)
    with LLM(str(model), max_model_len=128, **llm_kwargs) as llm:
        return nv_with_logprobs(llm.generate(PROMPTS, params, use_tqdm=False))


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_checkpoint) -> Path:
    """Inputs of whole groups of 128 for every projection, also per rank at TP 2 (o_proj 256, down_proj 256)."""
    return make_tiny_checkpoint("qwen3", hidden_size=128, intermediate_size=256, num_attention_heads=8,
                                num_key_value_heads=4, head_dim=32)


@pytest.fixture(scope="module")
def int4_dirs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for method in ("awq", "gptq"):
        made[method] = write_int4_checkpoint(tiny_dir, tmp_path_factory.mktemp(f"tiny_{method}"), method)
        for broken in ("nibble_order", "half_scales"):
            made[f"{method}_{broken}"] = write_int4_checkpoint(tiny_dir, tmp_path_factory.mktemp("broken"), method,
                                                               broken=broken)
    return made


@pytest.fixture(scope="module")
def dequantized_outputs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Per method, the outputs of the float model holding the dequantized weights."""
    return {method: generate(write_dequantized_checkpoint(tiny_dir, tmp_path_factory.mktemp("dequantized"), method))
            for method in ("awq", "gptq")}


def test_awq_and_gptq_checkpoints_are_close_to_the_unquantized_model(tiny_dir: Path, int4_dirs: dict[str, Path],
                                                                      dequantized_outputs: dict[str, list]) -> None:
    awq, gptq = generate(int4_dirs["awq"]), generate(int4_dirs["gptq"])
    check_logprobs_close(dequantized_outputs["awq"], awq, "dequantized awq weights", "awq checkpoint")
    check_logprobs_close(dequantized_outputs["gptq"], gptq, "dequantized gptq weights", "gptq checkpoint")
    assert awq != generate(tiny_dir)                                       # the weights did change
    online = generate(tiny_dir, quantization="awq")                        # the same round to nearest, at load
    assert [ids for ids, _ in online] == [ids for ids, _ in awq]


def test_the_triton_kernel_inside_the_engine_gives_the_torch_paths_tokens(int4_dirs: dict[str, Path]) -> None:
    """fused_ops "on": the INT4 layers run the Triton kernel in its interpreter (prefill rows and one-row decode
    steps on the launches a GPU takes for them: up to 16 rows the codes dequantized in pairs, split K), as on a
    GPU."""
    from nv_engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=TOP_K, ignore_eos=True)
    outputs = []
    for fused_ops in ("off", "on"):
        with LLM(str(int4_dirs["awq"]), max_model_len=64, fused_ops=fused_ops, enforce_eager=True) as llm:
            outputs.append(nv_with_logprobs(llm.generate(PROMPTS[:1], params, use_tqdm=False)))
    assert outputs[0][0][0] == outputs[1][0][0]
    check_logprobs_close(outputs[0], outputs[1], "torch", "triton")


@pytest.mark.parametrize("variant", ["awq_nibble_order", "awq_half_scales", "gptq_nibble_order",
                                     "gptq_half_scales"])
def test_broken_checkpoints_are_caught(int4_dirs: dict[str, Path], dequantized_outputs: dict[str, list],
                                       variant: str) -> None:
    method = variant.partition("_")[0]
    with pytest.raises(AssertionError, match="not in"):
        check_logprobs_close(dequantized_outputs[method], generate(int4_dirs[variant]), "dequantized", variant)


def _layers(model: torch.nn.Module) -> dict[str, LinearBase]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}


def _build(path: Path) -> torch.nn.Module:
    from transformers import AutoConfig

    from nv_layers.loader import build_model
    from nv_qwen3.model import Qwen3ForCausalLM

    return build_model(Qwen3ForCausalLM, AutoConfig.from_pretrained(path), path)


def _dequantized(layer: LinearBase) -> torch.Tensor:
    from nv_kernels.int4_gemm import dequantize_int4

    scales, zeros = layer.weight_scales, layer.weight_zeros
    assert layer.weight.dtype == torch.int32 and scales is not None and zeros is not None
    return dequantize_int4(layer.weight, scales, zeros)


def _reference(refs: dict[str, torch.Tensor], layer_name: str) -> torch.Tensor:
    head, _, leaf = layer_name.rpartition(".")
    return torch.cat([refs[f"{head}.{part}.weight"] for part in PACKED.get(leaf, (leaf,))])


@pytest.mark.parametrize("method", ["awq", "gptq", "gptq_zero_biases"])
def test_loaded_weights_equal_the_reference_dequantization(tiny_dir: Path, int4_dirs: dict[str, Path],
                                                           method: str, tmp_path: Path) -> None:
    if method == "gptq_zero_biases":   # AutoGPTQ's extra zero biases load as nothing
        method, path = "gptq", write_int4_checkpoint(tiny_dir, tmp_path / "biases", "gptq", zero_biases=True)
    else:
        path = int4_dirs[method]
    refs = reference_weights(tiny_dir, method)
    layers = _layers(_build(path))
    assert len(layers) == 4 * 2
    assert all(layer.weight_scales is not None and layer.weight_scales.dtype == torch.float16
               for layer in layers.values())
    for name, layer in layers.items():
        assert torch.equal(_dequantized(layer), _reference(refs, name)), name


def _rank_slice(full: torch.Tensor, layer_name: str, rank: int, config: dict) -> torch.Tensor:
    """The rows (columns for row-parallel layers) of `full` that rank `rank` of 2 holds."""
    leaf = layer_name.rpartition(".")[2]
    if leaf in ("o_proj", "down_proj"):
        return full.chunk(2, dim=1)[rank]
    if leaf == "gate_up_proj":
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]])
    q_size = config["num_attention_heads"] * config["head_dim"]
    kv_size = config["num_key_value_heads"] * config["head_dim"]
    q, k, v = full.split([q_size, kv_size, kv_size])
    return torch.cat([q.chunk(2)[rank], k.chunk(2)[rank], v.chunk(2)[rank]])


def test_tensor_parallel_shards_hold_the_reference_slices(tiny_dir: Path, int4_dirs: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_layers.parallel_state as parallel_state

    path = int4_dirs["awq"]
    config = json.loads((path / "config.json").read_text())
    full = {name: _dequantized(layer) for name, layer in _layers(_build(path)).items()}
    for rank in (0, 1):   # the layers read rank and size from torch.distributed: a stand-in of 2 ranks
        monkeypatch.setattr(parallel_state, "dist", SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda r=rank: r,
            get_world_size=lambda: 2))
        for name, layer in _layers(_build(path)).items():
            assert torch.equal(_dequantized(layer), _rank_slice(full[name], name, rank, config)), (rank, name)


def _with_config(src: Path, dst: Path, quantization_config: dict) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        (dst / file.name).symlink_to(file)
    (dst / "config.json").unlink()
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    return dst


def test_quantization_settings_that_nv_cannot_honour(tiny_dir: Path, int4_dirs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    from nv_engine import EngineArgs
    from nv_layers.int4_checkpoint import Int4CheckpointFormat

    awq, gptq = int4_dirs["awq"], int4_dirs["gptq"]
    assert EngineArgs(model=str(awq)).create_engine_config().quantization == "awq"
    assert EngineArgs(model=str(gptq), quantization="gptq").create_engine_config().quantization == "gptq"
    assert EngineArgs(model=str(tiny_dir), quantization="awq").create_engine_config().quantization == "awq"
    with pytest.raises(ValueError, match="does not match the checkpoint, which is 'gptq'"):
        EngineArgs(model=str(gptq), quantization="awq").create_engine_config()
    with pytest.raises(ValueError, match="does not match the checkpoint, which is 'awq'"):
        EngineArgs(model=str(awq), quantization="fp8").create_engine_config()
    with pytest.raises(ValueError, match="quantization='gptq' needs a GPTQ checkpoint"):
        EngineArgs(model=str(tiny_dir), quantization="gptq").create_engine_config()
    with pytest.raises(ValueError, match="quantization='int8'"):
        EngineArgs(model=str(tiny_dir), quantization="int8")
    refused = [(AWQ_CONFIG, "bits", 8), (AWQ_CONFIG, "group_size", 64), (AWQ_CONFIG, "zero_point", False),
               (AWQ_CONFIG, "version", "gemv"), (GPTQ_CONFIG, "desc_act", True), (GPTQ_CONFIG, "bits", 3),
               (GPTQ_CONFIG, "checkpoint_format", "marlin"), (GPTQ_CONFIG, "lm_head", True),
               (GPTQ_CONFIG, "pack_dtype", "int8")]
    for i, (base, key, value) in enumerate(refused):
        other = _with_config(awq, tmp_path / f"refused{i}", {**base, key: value})
        with pytest.raises(ValueError, match=f"{key}={value!r}.*nv runs AWQ .*group_size 128.* and GPTQ"):
            EngineArgs(model=str(other)).create_engine_config()
    other = _with_config(awq, tmp_path / "bnb", {"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match="quant_method='bitsandbytes'.*block-wise FP8.*AWQ.*GPTQ"):
        EngineArgs(model=str(other)).create_engine_config()
    g_idx = torch.arange(256, dtype=torch.int32) // 128
    Int4CheckpointFormat.check_g_idx(g_idx, "x.g_idx")
    with pytest.raises(ValueError, match="act-order"):
        Int4CheckpointFormat.check_g_idx(g_idx.flip(0), "x.g_idx")


@pytest.mark.parametrize("source", ["online", "awq", "gptq"])
def test_the_benchmark_floor_counts_the_int4_weights_the_model_holds(tiny_dir: Path, int4_dirs: dict[str, Path],
                                                                     source: str) -> None:
    from transformers import AutoConfig

    from nv_engine.entrypoints.bench.throughput import checkpoint_weight_bytes
    from nv_layers.loader import build_model
    from nv_qwen3.model import Qwen3ForCausalLM

    path = tiny_dir if source == "online" else int4_dirs[source]
    quantization = "awq" if source == "online" else source
    model = build_model(Qwen3ForCausalLM, AutoConfig.from_pretrained(path), path,
                        quantization="awq" if source == "online" else None)
    itemsize = model.model.embed_tokens.weight.element_size()
    held = runtime_weight_bytes(model)
    assert checkpoint_weight_bytes(str(path), itemsize, quantization) == held
    assert 3 * held < checkpoint_weight_bytes(str(tiny_dir), itemsize) * 2       # projections at ~a quarter
