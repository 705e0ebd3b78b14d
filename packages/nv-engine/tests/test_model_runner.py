"""ModelRunner on CPU: KV-cache sizing, cache layout, steps with and without sampling rows."""
from __future__ import annotations

import pytest
import torch

from nv_kvcache import Scheduler, Sequence, StopRules

from nv_engine.engine_args import EngineArgs
from nv_engine.step_builder import StepBuilder
from nv_engine.runner.memory import CPU_KV_CACHE_ENV, MemoryProfile, graph_reserve
from nv_engine.runner.model_runner import ModelRunner


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    config = EngineArgs(str(tiny_model_dir), device="cpu", max_model_len=256, max_num_seqs=8,
                        block_size=16).create_engine_config()
    r = ModelRunner(config, 0)
    yield r
    r.shutdown()


def test_kv_cache_size_and_layout(runner, monkeypatch):
    hf = runner.config.hf_config
    per_block = 2 * runner.config.block_size * hf.num_key_value_heads * hf.head_dim * 4 * hf.num_hidden_layers
    assert runner.kv_block_bytes() == per_block
    assert runner.determine_num_blocks() == 8 * 256 // 16          # every sequence at full length
    monkeypatch.setenv(CPU_KV_CACHE_ENV, str(10 * per_block / 2**30))
    assert runner.determine_num_blocks() == 10
    monkeypatch.setenv(CPU_KV_CACHE_ENV, "lots")
    with pytest.raises(ValueError, match=CPU_KV_CACHE_ENV):
        runner.determine_num_blocks()
    runner.allocate_kv_cache(12)
    layer = runner.attention_layers[0]
    assert layer.k_cache.shape == (12, 16, hf.num_key_value_heads, hf.head_dim)
    assert layer.k_cache.data_ptr() != layer.v_cache.data_ptr()
    runner.capture_cudagraphs()                                     # CPU: eager, nothing captured
    assert runner.graphs is None


def test_partial_prefill_chunk_samples_nothing(runner):
    runner.allocate_kv_cache(32)
    sched = Scheduler(num_blocks=32, block_size=16, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=256)
    builder = StepBuilder(16, runner.config.max_blocks_per_seq)
    seq = Sequence(list(range(1, 41)), StopRules(max_tokens=3, ignore_eos=True))
    sched.add(seq)
    samples = []
    while sched.has_unfinished():
        out = sched.schedule()
        result = runner.execute(builder.build(out))
        assert len(result.token_ids) == len(out.sampling)
        samples.append(len(result.token_ids))
        sched.postprocess(out, result.token_ids)
    assert samples[:2] == [0, 0] and sum(samples) == 3               # 40 tokens in 16-token chunks


def test_memory_profile_budget():
    profile = MemoryProfile(total=100 << 30, non_torch=1 << 30, peak=5 << 30, graph_reserve=graph_reserve(1 << 30))
    assert profile.graph_reserve > 1 << 30
    assert profile.kv_budget(0.9) == int(90 * 2**30) - (1 << 30) - (5 << 30) - profile.graph_reserve
    assert "KV" in profile.describe(0.9)


def test_profile_runs_work_on_any_device(runner):
    """The dummy steps of the CUDA memory profile (a max-size prefill without KV cache plus a
    worst-case sampler; a decode over a scratch one-block cache) run, and put the cache back."""
    from nv_engine.runner.memory import dummy_decode, dummy_prefill

    runner.allocate_kv_cache(32)
    with torch.inference_mode():
        dummy_prefill(runner, 300, 8)          # two sequences: 256 (max_model_len) + 44 tokens
        dummy_decode(runner, 8)
    assert runner.attention_layers[0].k_cache.shape[0] == 32          # the real cache is back
