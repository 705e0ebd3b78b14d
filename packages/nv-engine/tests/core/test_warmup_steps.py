"""The engine's start-up warm-up (warmup_steps.WarmupSteps): its steps cover every shape class and
sampler path a request can meet, stay inside the engine's limits, and running them on a real engine
leaves it correct (the KV cache garbage they write is never read by a request)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from nv_engine.core.warmup_steps import WarmupSteps
from nv_engine.runner.cuda_graphs import graph_batch_sizes


def _int_class(value: int) -> str:
    return "one" if value == 1 else "div16" if value % 16 == 0 else "other"


def test_steps_cover_the_shape_classes_and_sampler_paths():
    warmup = WarmupSteps(block_size=16, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=1024,
                         num_blocks=100, vocab_size=1000, max_logprobs=20)
    steps = list(warmup.steps())
    eager = [s for s in steps if not s.is_decode]
    for step in steps:      # inside the engine's limits
        assert step.num_tokens <= 512 and step.num_seqs <= 64 and int(step.seq_lens.max()) <= 1024
        assert step.slot_mapping.max() < 100 * 16 and step.block_tables.max() < 100
        assert step.cu_seqlens_q[-1] == step.num_tokens and len(step.positions) == step.num_tokens
        if step.sampling is not None:
            assert step.sampling.num_rows == len(step.logits_indices)
    assert {_int_class(s.num_tokens) for s in eager} == {"one", "div16", "other"}
    assert {_int_class(s.block_tables.shape[1]) for s in eager} == {"one", "div16", "other"}
    assert any(s.positions[0] > 0 for s in eager)                               # a cached prefix
    assert any(len(s.logits_indices) == 0 for s in eager)                       # a chunk that samples nothing
    assert any(s.num_tokens == 512 for s in eager)                              # a full budget chunk
    assert any((np.diff(s.cu_seqlens_q) == 1).any() and s.max_seqlen_q > 1 for s in eager)   # mixed
    decode_sizes = {s.num_seqs for s in steps if s.is_decode}
    assert set(graph_batch_sizes(64)) <= decode_sizes
    assert any(s.is_decode and s.max_seqlen_k == 1024 for s in steps)          # max_model_len context
    flags = [s.sampling.flags for s in steps if s.sampling is not None]
    for name in ("any_top_k", "any_top_p", "any_min_p", "need_logprobs"):
        assert any(f[name] for f in flags), name
    assert any(f["all_greedy"] for f in flags) and any(not f["any_greedy"] for f in flags)
    assert any(f["any_greedy"] and not f["all_greedy"] for f in flags)
    arrays = {name for s in steps if s.sampling is not None for name in s.sampling.arrays}
    assert {"presence_penalties", "frequency_penalties", "repetition_penalties", "logit_bias_ids",
            "allowed_token_ids"} <= arrays
    assert any(s.sampling is not None and s.sampling.banned_token_ids is not None for s in steps)   # min_tokens
    assert any(s.prompt_logprobs is not None for s in eager)
    sizes = warmup.sampler_sizes()
    assert sizes[0] == 1 and {_int_class(n) for n in sizes} == {"one", "div16", "other"}


def test_small_limits_still_give_valid_steps():
    warmup = WarmupSteps(block_size=16, max_num_seqs=2, max_num_batched_tokens=20, max_model_len=40,
                         num_blocks=3, vocab_size=50)
    for step in warmup.steps():
        assert step.num_tokens <= 20 and step.num_seqs <= 2 and int(step.seq_lens.max()) <= 40
    with pytest.raises(ValueError, match="positive"):
        WarmupSteps(block_size=16, max_num_seqs=0, max_num_batched_tokens=20, max_model_len=40, num_blocks=3,
                    vocab_size=50)


def test_warmup_on_a_real_engine_leaves_it_correct(tiny_model_dir):
    from nv_engine import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8,
              max_num_batched_tokens=64, num_gpu_blocks_override=64)
    try:
        prompts = [{"prompt_token_ids": [(7 * i + 3) % 200 for i in range(n)]} for n in (5, 40, 90)]
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        before = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        engine = llm.llm_engine
        engine.scheduler.block_manager.reset_prefix_cache()    # as at engine start: no block is known
        warmup = WarmupSteps.for_engine(engine.config, engine.num_blocks, (0,))
        start = time.perf_counter()
        count = warmup.run(engine.live_executor())
        print(f"warm-up on CPU: {count} steps in {time.perf_counter() - start:.2f} s")
        assert count > 40
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.num_cached_tokens for o in outputs] == [0, 0, 0]    # no block the warm-up wrote is read
        assert [o.outputs[0].token_ids for o in outputs] == before
    finally:
        llm.shutdown()
