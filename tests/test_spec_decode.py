"""Speculative decoding (ngram) end to end on CPU: greedy output token-identical with and without drafts on a
tiny random checkpoint and on SmolLM2, with prefix caching and with a forced preemption; drafts accepted."""
from __future__ import annotations

import pytest
import torch

from nv_engine import LLM, SamplingParams
from nv_kvcache import SchedulerStats

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tests/conftest.py

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def repetitive_prompts(vocab: int) -> list[list[int]]:
    """Prompts of a repeated token pattern: greedy continuations tend to keep copying it."""
    return [([(7 * i + j * 13) % vocab + 1 for j in range(5)] * 6)[: 20 + 3 * i] for i in range(4)]


def generate(model_dir, prompts, params, **kwargs) -> tuple[list[list[int]], SchedulerStats]:
    llm = LLM(str(model_dir), **kwargs)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kwargs", [{}, {"enable_prefix_caching": True, "block_size": 16},
                                    {"num_gpu_blocks_override": 8, "block_size": 16, "max_model_len": 96}],
                         ids=["plain", "prefix-cache", "preemption"])
def test_tiny_checkpoint_greedy_is_identical(tiny_qwen3_dir, kwargs):
    prompts = repetitive_prompts(200)
    reference, _ = generate(tiny_qwen3_dir, prompts, GREEDY, **kwargs)
    spec, stats = generate(tiny_qwen3_dir, prompts, GREEDY, speculative_config=NGRAM, **kwargs)
    assert spec == reference
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0
    if "num_gpu_blocks_override" in kwargs:
        assert stats.num_preemptions > 0


def test_smollm2_greedy_is_identical(smollm2_dir):
    llm_prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a +",
                   "The cat sat on the mat. The cat sat on the mat. The cat sat"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    prompts = [tokenizer(p)["input_ids"] for p in llm_prompts]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    reference, _ = generate(smollm2_dir, prompts, params, max_model_len=256)
    spec, stats = generate(smollm2_dir, prompts, params, max_model_len=256, speculative_config=NGRAM)
    assert spec == reference
    assert stats.num_accepted_tokens > 0


def test_seeded_sampling_with_drafts_is_reproducible_and_respects_max_tokens(tiny_qwen3_dir):
    params = SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=17, ignore_eos=True)
    prompts = repetitive_prompts(200)
    first, stats = generate(tiny_qwen3_dir, prompts, params, speculative_config=NGRAM)
    again, _ = generate(tiny_qwen3_dir, prompts, params, speculative_config=NGRAM)
    assert first == again and all(len(tokens) == 17 for tokens in first)
    assert stats.num_draft_tokens > 0


def test_no_drafts_while_a_request_wants_logprobs(tiny_qwen3_dir):
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    _, stats = generate(tiny_qwen3_dir, repetitive_prompts(200), params, speculative_config=NGRAM)
    assert stats.num_draft_tokens == 0


def test_serve_flag_parses():
    import argparse

    from nv_engine.entrypoints.server.cli import add_serve_parser, engine_kwargs

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    kwargs = engine_kwargs(args)
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}


def test_verify_steps_replay_the_emulated_verify_graphs(tiny_qwen3_dir):
    """The CUDA-graph input path on CPU (replays run eagerly from the static staging addresses): every verify step
    replays a verify graph (Q = 1 + k rows per sequence, front-padded, batches padded to the captured sizes) and the
    greedy output equals the output without speculation. Fixed-length drafts: every step whose lookup finds drafts
    verifies them (the adaptive policy would pipeline most of this tiny random model's steps instead)."""
    lengths = [32, 12, 32, 20]                 # sequences that finish early leave padded verify batches
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    prompts = repetitive_prompts(200)
    reference, _ = generate(tiny_qwen3_dir, prompts, GREEDY)
    llm = LLM(str(tiny_qwen3_dir), speculative_config={**NGRAM, "adaptive_draft_length": False})
    runner = llm.llm_engine.executor.runner
    runner.capture_cudagraphs(emulate=True)
    replayed: list[tuple[int, int]] = []
    replay = runner.verify_graphs.replay
    runner.verify_graphs.replay = lambda padded, n: (replayed.append((padded, n)), replay(padded, n))[1]
    verify_steps: list[bool] = []
    launch = runner.launch
    runner.launch = lambda step: (verify_steps.append(step.num_drafts is not None), launch(step))[1]
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [r[:n] for r, n in zip(reference, lengths, strict=True)]
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0
    assert len(replayed) == sum(verify_steps) > 3 and any(padded > n for padded, n in replayed)


def test_steps_without_drafts_stay_pipelined_and_outputs_match_across_switches(tiny_qwen3_dir):
    """ngram with max_batch_size 3 over 6 requests of different lengths: while more than 3 sequences run, steps
    draft nothing and take the async path (launched before the previous step's ids are back); as requests finish
    the batch falls under the threshold, the pipeline drains and drafting steps run synchronously. The greedy
    output equals the output without speculation."""
    prompts = [([(5 * i + j * 11) % 199 + 1 for j in range(4)] * 6)[: 16 + 2 * i] for i in range(6)]
    lengths = [6, 10, 14, 20, 28, 36]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    requests = [{"prompt_token_ids": p} for p in prompts]
    reference, _ = generate(tiny_qwen3_dir, prompts, SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True))
    llm = LLM(str(tiny_qwen3_dir), speculative_config={**NGRAM, "max_batch_size": 3})
    core = llm.llm_engine.core
    assert core.async_scheduling
    calls = record_paths(core)
    try:
        outputs = llm.generate(requests, params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [r[:n] for r, n in zip(reference, lengths, strict=True)]
    assert stats.num_accepted_tokens > 0
    assert all(path == "launched" for path, _, drafts in calls if drafts)          # drafting: never pipelined
    assert all(path == "pipelined" for path, n, _ in calls[1:] if n > 3)            # above the threshold
    assert ("pipelined", 6, False) in calls and any(drafts for _, _, drafts in calls)


def record_paths(core) -> list[tuple[str, int, bool]]:
    """Wrap the core's executor: per step (path, sequences, drafts), path "pipelined" for a step launched while
    the previous one is still uncollected, "launched" for one launched alone, "sync" for one executed."""
    calls: list[tuple[str, int, bool]] = []
    executor = core.executor
    launch, execute = executor.launch, executor.execute

    def launched(step):
        calls.append(("pipelined" if core._num_uncollected else "launched", step.num_seqs, step.num_drafts is not None))
        return launch(step)

    executor.launch = launched
    executor.execute = lambda step: (calls.append(("sync", step.num_seqs, step.num_drafts is not None)),
                                     execute(step))[1]
    return calls


def test_steps_pipeline_while_the_proposer_finds_nothing(tiny_qwen3_dir):
    """Drafting allowed (2 sequences, max_batch_size 8) but nothing to look up: after a few steps that try, steps
    pipeline, every PROBE_EVERY-th one still trying; the output equals the output without speculation."""
    from nv_engine.spec_decode.speculative_decoding import PROBE_EVERY, QUIET_STEPS

    prompts = repetitive_prompts(200)[:2]
    reference, _ = generate(tiny_qwen3_dir, prompts, GREEDY)
    llm = LLM(str(tiny_qwen3_dir), speculative_config=NGRAM)
    core = llm.llm_engine.core
    core.scheduler.drafts.propose = lambda token_ids, most: []
    calls = record_paths(core)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == reference
    alone = sum(path == "launched" for path, _, _ in calls)
    assert alone <= 1 + QUIET_STEPS + len(calls) // PROBE_EVERY + 1
    assert sum(path == "pipelined" for path, _, _ in calls) > len(calls) // 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_ngram_on_cuda_verify_graphs_and_pipelined_steps(make_tiny_checkpoint):
    """On CUDA (graphs captured, Triton attention): every verify step replays a verify graph (decode_queries inside
    it) and greedy output equals the output without speculation in fp32, at a batch that drafts and at one above
    max_batch_size, where the steps pipeline."""
    shape = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=512)
    target = make_tiny_checkpoint("qwen3", **shape)
    kwargs = {"dtype": "float32", "gpu_memory_utilization": 0.3, "max_num_seqs": 16}
    prompts = [([(7 * i + j * 13) % 200 + 1 for j in range(5)] * 12)[: 40 + 3 * i] for i in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    reference, _ = generate(target, prompts, params, **kwargs)
    llm = LLM(str(target), speculative_config={**NGRAM, "max_batch_size": 4}, **kwargs)
    runner = llm.llm_engine.executor.runner
    assert runner.verify_graphs is not None and runner.verify_graphs.graphs.graphs
    replayed: list[int] = []
    replay = runner.verify_graphs.replay
    runner.verify_graphs.replay = lambda padded, n: (replayed.append(n), replay(padded, n))[1]
    calls = record_paths(llm.llm_engine.core)
    try:
        small = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params, use_tqdm=False)
        large = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in small] == reference[:3]
    assert [o.outputs[0].token_ids for o in large] == reference
    assert stats.num_accepted_tokens > 0
    assert len(replayed) == sum(drafts for _, _, drafts in calls) > 0
    assert any(path == "pipelined" and n == 12 for path, n, _ in calls)


def random_prompts(vocab: int, seed: int) -> list[list[int]]:
    """Random token prompts: what the proposer finds in them (and in their continuations) is mostly rejected."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(24)] for _ in range(4)]


def record_drafts(core) -> list[tuple[int, int]]:
    """Wrap the core's scheduler: per scheduled step (draft tokens, sampling sequences)."""
    steps: list[tuple[int, int]] = []
    schedule = core.scheduler.schedule

    def scheduled():
        out = schedule()
        steps.append((out.num_draft_tokens, len(out.sampling)))
        return out

    core.scheduler.schedule = scheduled
    return steps


@pytest.mark.parametrize("seed", [0, 2])     # prompts whose continuations reject most fixed-length drafts
def test_adaptive_draft_length_cuts_rejected_drafts_and_keeps_greedy_output(tiny_qwen3_dir, seed):
    """Random prompts on a tiny model (k = 3), where drafts of a fixed length are mostly rejected: after the first
    steps, sequences draft far fewer than k tokens per step (those whose drafts are rejected stop), rejecting under
    half the drafts a fixed length rejects; greedy output equals the output without speculation, adaptive or
    not."""
    prompts = random_prompts(200, seed)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    reference, _ = generate(tiny_qwen3_dir, prompts, params)
    fixed, fixed_stats = generate(tiny_qwen3_dir, prompts, params,
                                  speculative_config={**NGRAM, "adaptive_draft_length": False})
    llm = LLM(str(tiny_qwen3_dir), speculative_config=NGRAM)
    steps = record_drafts(llm.llm_engine.core)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == fixed == reference
    assert fixed_stats.num_accepted_tokens < 0.5 * fixed_stats.num_draft_tokens, "the workload's premise"
    later = steps[16:]
    drafts_per_sequence_step = sum(d for d, _ in later) / sum(n for _, n in later)
    assert drafts_per_sequence_step < 1.0                      # k = 3
    rejected = stats.num_draft_tokens - stats.num_accepted_tokens
    assert rejected < 0.5 * (fixed_stats.num_draft_tokens - fixed_stats.num_accepted_tokens)
    assert stats.num_accepted_tokens > 0                       # what repeats is still drafted


def test_sequences_whose_drafts_all_fail_stop_drafting_and_steps_pipeline(tiny_qwen3_dir):
    """A proposer whose first draft is always wrong (the reference's next token plus one): each sequence drafts in
    its first step, then only in probes after a doubling backoff (8, 16, 32, 64 tokens), and while every sequence
    waits for its probe the steps pipeline; the output equals the output without speculation."""
    prompts = repetitive_prompts(200)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    reference, _ = generate(tiny_qwen3_dir, prompts, params)
    by_prompt = {tuple(p): r for p, r in zip(prompts, reference, strict=True)}

    def wrong(token_ids, most):
        prompt = next(p for p in by_prompt if tuple(token_ids[:len(p)]) == p)
        following = by_prompt[prompt][len(token_ids) - len(prompt)]
        return [(following + 1) % 200] * min(most, NGRAM["num_speculative_tokens"])

    llm = LLM(str(tiny_qwen3_dir), speculative_config=NGRAM)
    core = llm.llm_engine.core
    core.scheduler.drafts.propose = wrong
    calls = record_paths(core)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert stats.num_accepted_tokens == 0
    assert stats.num_draft_tokens <= 2 * 5 * 3                  # per sequence: its first step and 4 probes
    assert sum(path == "pipelined" for path, _, _ in calls) > 0.8 * len(calls)
