"""kv_cache_dtype="fp8" / "fp8_e5m2" on the tiny Qwen3 (CPU, fp32, the torch reference backend).

The engine's invariants hold with an FP8 cache as with the default one (every attention, prefill
included, reads the quantized K/V): a prefix-cache hit gives the tokens a miss gives, chunked prefill
gives the tokens one-step prefill gives, preemption keeps the greedy tokens. The scales come from the
checkpoint or a calibration run (per tensor, broadcast over the [Hkv, D] grid the kernels read), or 1.0,
and are fixed before the first request.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from hf_compare import random_prompts
from safetensors.torch import load_file, save_file

from nv_engine import LLM, LLMEngine, SamplingParams
from nv_engine.config.engine_args import EngineArgs
from nv_kernels.kv_quant import fp8_max
from nv_layers.attention import Attention

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tests/conftest.py

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _generate(model_dir: Path, prompts: list[list[int]], **kwargs) -> list[list[int]]:
    llm = LLM(str(model_dir), block_size=16, **kwargs)
    try:
        return [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY, use_tqdm=False)]
    finally:
        llm.shutdown()


def _attention_layers(llm: LLM) -> list[Attention]:
    runner = llm.llm_engine.executor.runner  # the in-process runner (one rank, CPU)
    return [m for m in runner.model.modules() if isinstance(m, Attention)]


def test_kv_cache_dtype_values() -> None:
    for name in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
        assert EngineArgs(model="m", kv_cache_dtype=name).kv_cache_dtype == name
    for bad in ("fp16", "int8", "FP8", ""):
        with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
            EngineArgs(model="m", kv_cache_dtype=bad)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_prefix_hit_equals_miss(tiny_qwen3_dir: Path, kv_cache_dtype: str) -> None:
    prefix = random_prompts([40], seed=1)[0]
    prompts = [prefix + tail for tail in random_prompts([5, 9, 12], seed=2)]
    llm = LLM(str(tiny_qwen3_dir), block_size=16, kv_cache_dtype=kv_cache_dtype)
    try:
        first = llm.generate([prompts[0]], GREEDY, use_tqdm=False)[0]
        rest = llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert all(out.num_cached_tokens == 32 for out in rest)
    hits = [first.outputs[0].token_ids] + [out.outputs[0].token_ids for out in rest]
    misses = _generate(tiny_qwen3_dir, prompts, kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=False)
    assert hits == misses


def test_chunked_prefill_equals_one_step(tiny_qwen3_dir: Path) -> None:
    """Chunks read the earlier chunks' K/V from the FP8 cache as one step reads its own: the same prompt
    logprobs and greedy tokens (the calibrated scales do not depend on the step budget)."""
    prompts = random_prompts([3, 17, 50, 71], seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=0)

    def run(**kwargs) -> list:
        with LLM(str(tiny_qwen3_dir), block_size=16, kv_cache_dtype="fp8", **kwargs) as llm:
            return llm.generate(prompts, params, use_tqdm=False)

    one_step, chunked = run(), run(max_num_batched_tokens=16)
    for a, b, prompt in zip(one_step, chunked, prompts, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for j, token in enumerate(prompt[1:], start=1):
            assert a.prompt_logprobs[j][token].logprob == pytest.approx(b.prompt_logprobs[j][token].logprob,
                                                                         abs=1e-5)


def test_preemption_keeps_greedy_tokens(tiny_qwen3_dir: Path) -> None:
    prompts = random_prompts([30, 31, 29, 33], seed=3)
    engine = LLMEngine(model=str(tiny_qwen3_dir), kv_cache_dtype="fp8", num_gpu_blocks_override=10, block_size=16,
                       max_model_len=160, stream_outputs=False)
    preempted = []
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        preempted.extend(out.preempted)
        return out

    engine.scheduler.schedule = spy
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out
    engine.shutdown()
    assert preempted, "a 10-block cache for 4 x 54 tokens must preempt"
    alone = _generate(tiny_qwen3_dir, prompts, kv_cache_dtype="fp8")
    assert [done[str(i)].outputs[0].token_ids for i in range(len(prompts))] == alone


def test_calibrated_scales_are_fixed_and_logged(tiny_qwen3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nv_engine.runner.model_runner"):
        llm = LLM(str(tiny_qwen3_dir), block_size=16, kv_cache_dtype="fp8")
    try:
        layers = _attention_layers(llm)
        before = torch.stack([torch.stack([layer.k_scale, layer.v_scale]) for layer in layers])   # [L, 2, Hkv, D]
        runner = llm.llm_engine.executor.runner
        assert runner.kv_block_bytes() == 2 * 16 * 2 * 16 * 2   # 1 byte: 2 layers x K,V x 16 tokens x 2 x 16
        assert all(layer.k_cache.dtype == torch.float8_e4m3fn for layer in layers)
        llm.generate(random_prompts([30], seed=9), GREEDY, use_tqdm=False)
        assert torch.equal(torch.stack([torch.stack([layer.k_scale, layer.v_scale]) for layer in layers]), before)
    finally:
        llm.shutdown()
    # K after q/k-norm and rotary of random weights: calibrated, not 1.0, and within the FP8 range;
    # [Hkv, D] per layer, one calibrated number per tensor (kv_scales.K_GRANULARITY) broadcast
    assert before.shape == (2, 2, 2, 16)
    assert bool(((before > 0) & (before < 1)).all())
    assert all(len(tensor.unique()) == 1 for tensor in before.reshape(4, -1))
    assert len(before.unique()) == 4
    assert any("dtype float8_e4m3fn" in r.message and "calibrated on" in r.message for r in caplog.records)


def test_checkpoint_scales_and_calibration_off(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "with_scales"
    shutil.copytree(tiny_qwen3_dir, model_dir)
    weights = load_file(str(model_dir / "model.safetensors"))
    # layer 0 as vLLM names them, layer 1 in the older k_proj/v_proj form; scalars as in FP8 checkpoints
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor(0.02)
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(0.03)
    weights["model.layers.1.self_attn.k_proj.k_scale"] = torch.tensor(0.04)
    weights["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor(0.05)
    save_file(weights, str(model_dir / "model.safetensors"))

    def scales(**kwargs) -> list[tuple[list[float], list[float]]]:
        """Per layer the distinct K and V scale values over its (KV head, channel) grid."""
        llm = LLM(str(model_dir), block_size=16, kv_cache_dtype="fp8", **kwargs)
        try:
            return [(layer.k_scale.unique().tolist(), layer.v_scale.unique().tolist())
                    for layer in _attention_layers(llm)]
        finally:
            llm.shutdown()

    # per tensor from the checkpoint, broadcast to every (KV head, channel)
    from_checkpoint = [([pytest.approx(0.02)], [pytest.approx(0.03)]), ([pytest.approx(0.04)], [pytest.approx(0.05)])]
    assert scales() == from_checkpoint
    assert scales(calculate_kv_scales=False) == from_checkpoint
    calibrated = scales(calculate_kv_scales=True)
    assert calibrated != from_checkpoint
    assert all(len(k) == len(v) == 1 and k[0] < fp8_max(torch.float8_e4m3fn) for k, v in calibrated)
    assert _generate(model_dir, random_prompts([20], seed=4), kv_cache_dtype="auto")   # scales ignored


def test_calibration_off_without_checkpoint_scales_is_one(tiny_qwen3_dir: Path) -> None:
    llm = LLM(str(tiny_qwen3_dir), block_size=16, kv_cache_dtype="fp8_e5m2", calculate_kv_scales=False)
    try:
        assert all(bool((layer.k_scale == 1.0).all() and (layer.v_scale == 1.0).all())
                   for layer in _attention_layers(llm))
        assert llm.generate(random_prompts([20], seed=4), GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()
