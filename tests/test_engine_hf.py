"""LLM.generate against HF transformers on tiny random checkpoints (CPU, fp32), and on the GPU.

Greedy tokens must equal HF's token for token, whatever the batching: chunked-prefill budgets,
prefix-cache hits, preemption, n > 1 siblings, greedy rows next to sampled ones. Logprobs must
equal HF's log_softmax. On the GPU: CUDA graphs vs eager, and bf16 at the Qwen3-0.6B shape by
vLLM's check_logprobs_close rule (tests/hf_compare.py).
"""
from __future__ import annotations

import pytest
import torch
from hf_compare import (
    check_logprobs_close,
    hf_greedy,
    hf_with_logprobs,
    load_hf,
    nv_with_logprobs,
)
from hf_compare import random_prompts as _prompts

from nv_engine import LLM, LLMEngine, SamplingParams

MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def hf_ref(tiny_qwen3_dir):
    model = load_hf(tiny_qwen3_dir)
    cache: dict[tuple, tuple[list[int], torch.Tensor]] = {}

    def ref(prompt: list[int], num_tokens: int = MAX_TOKENS) -> tuple[list[int], torch.Tensor]:
        key = (tuple(prompt), num_tokens)
        if key not in cache:
            cache[key] = hf_greedy(model, prompt, num_tokens)
        return cache[key]

    return ref


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    engine = LLM(str(tiny_qwen3_dir), block_size=16)   # short test prompts still fill whole blocks
    yield engine
    engine.shutdown()


# ---- CPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [16, 64, None], ids=["chunk16", "chunk64", "unlimited"])
def test_greedy_batch_matches_hf(tiny_qwen3_dir, hf_ref, budget):
    prompts = _prompts([3, 17, 33, 50, 71])
    llm = LLM(str(tiny_qwen3_dir), max_num_batched_tokens=budget) if budget else None
    try:
        outputs = (llm or LLM(str(tiny_qwen3_dir))).generate(prompts, GREEDY, use_tqdm=False)
    finally:
        if llm:
            llm.shutdown()
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == hf_ref(prompt)[0]
        assert out.outputs[0].finish_reason == "length"


def test_string_prompt_matches_hf(llm, hf_ref):
    out = llm.generate("Hello, world! How are you", GREEDY, use_tqdm=False)[0]
    ids = llm.get_tokenizer().encode("Hello, world! How are you")
    assert out.prompt_token_ids == ids and out.prompt == "Hello, world! How are you"
    assert out.outputs[0].token_ids == hf_ref(ids)[0]
    full = llm.get_tokenizer().decode(out.outputs[0].token_ids, skip_special_tokens=True)
    assert out.outputs[0].text == full.rstrip("\ufffd")    # a character cut at the end is not emitted


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_caching_hits_and_matches_hf(tiny_qwen3_dir, hf_ref, caching):
    prefix = _prompts([40], seed=1)[0]
    prompts = [prefix + tail for tail in _prompts([5, 9, 12], seed=2)]
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=caching, block_size=16)
    try:
        first = llm.generate([prompts[0]], GREEDY, use_tqdm=False)[0]
        rest = llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert first.num_cached_tokens == 0
    for prompt, out in zip(prompts, [first, *rest], strict=True):
        assert out.outputs[0].token_ids == hf_ref(prompt)[0]
    for out in rest:
        assert out.num_cached_tokens == (32 if caching else 0)   # two full 16-token blocks of the prefix


def test_preemption_gives_the_same_tokens(tiny_qwen3_dir, hf_ref):
    prompts = _prompts([30, 31, 29, 33], seed=3)
    engine = LLMEngine(model=str(tiny_qwen3_dir), num_gpu_blocks_override=10, block_size=16, max_model_len=160,
                       stream_outputs=False)
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
    assert preempted, "a 10-block cache for 4 x 70 tokens must preempt"
    for i, prompt in enumerate(prompts):
        assert done[str(i)].outputs[0].token_ids == hf_ref(prompt)[0]
    assert engine.scheduler.block_manager.num_free_blocks == 10


def test_n3_siblings_share_the_prompt_blocks(llm, hf_ref):
    prompt = _prompts([40], seed=4)[0]
    added = []
    add = llm.llm_engine.scheduler.add
    llm.llm_engine.scheduler.add = lambda seq: (added.append(seq), add(seq))[1]
    try:
        out = llm.generate([prompt], SamplingParams(n=3, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                           use_tqdm=False)[0]
    finally:
        llm.llm_engine.scheduler.add = add
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for completion in out.outputs:
        assert completion.token_ids == hf_ref(prompt)[0]
    assert len(added) == 3 and [s.num_cached_tokens for s in added[1:]] == [32, 32]


def test_n3_sampling_is_seeded(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    first = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0]
    again = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0]
    tokens = [c.token_ids for c in first.outputs]
    assert tokens == [c.token_ids for c in again.outputs]
    assert len({tuple(t) for t in tokens}) == 3       # seed + index: three different completions


def test_mixed_greedy_and_sampled_batch(llm, hf_ref):
    prompts = _prompts([6, 20, 11, 35], seed=5)
    sampled = [SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=100 + i, max_tokens=20, ignore_eos=True)
               for i in range(len(prompts))]
    params = [GREEDY if i % 2 == 0 else sampled[i] for i in range(len(prompts))]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        if i % 2 == 0:
            assert out.outputs[0].token_ids == hf_ref(prompt)[0]
        else:  # a seeded row draws the same tokens alone as in a mixed batch
            alone = llm.generate([prompt], sampled[i], use_tqdm=False)[0]
            assert out.outputs[0].token_ids == alone.outputs[0].token_ids
            assert len(out.outputs[0].token_ids) == 20


def test_logprobs_match_hf(llm, hf_ref):
    prompts = _prompts([9, 24], seed=6)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                   logprobs=5), use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        tokens, ref = hf_ref(prompt)
        completion = out.outputs[0]
        assert completion.token_ids == tokens and len(completion.logprobs) == MAX_TOKENS
        for pos, (token, entry) in enumerate(zip(tokens, completion.logprobs, strict=True)):
            assert entry[token].rank == 1
            top = ref[pos].topk(5)
            assert set(entry) == set(top.indices.tolist())
            for tok, lp in entry.items():
                assert abs(lp.logprob - float(ref[pos, tok])) < 1e-4, (pos, tok)
        assert completion.cumulative_logprob == pytest.approx(float(sum(ref[i, t] for i, t in enumerate(tokens))),
                                                              abs=1e-3)
    check_logprobs_close(nv_with_logprobs(outputs), hf_with_logprobs([hf_ref(p) for p in prompts], 5), "nv", "hf")


def test_emulated_decode_graphs_match_hf(tiny_qwen3_dir, hf_ref):
    """The CUDA-graph input path on CPU: static staging addresses, batches padded to captured sizes
    (padding rows: slot -1, length 0), context bound max_model_len; replays run eagerly. Prefill steps
    take the piecewise graphs' path (padded, attention between the pieces on the real rows)."""
    prompts = _prompts([3, 17, 33, 50, 71, 5, 9, 12, 40, 2, 66], seed=7)
    params = [SamplingParams(temperature=0.0, max_tokens=10 + 3 * i, ignore_eos=True) for i in range(len(prompts))]
    llm = LLM(str(tiny_qwen3_dir), max_num_seqs=12)
    runner = llm.llm_engine.executor.runner
    runner.capture_cudagraphs(emulate=True)
    replayed = []
    replay = runner.graphs.replay
    runner.graphs.replay = lambda padded, batch: (replayed.append((padded, batch)), replay(padded, batch))[1]
    mixed_replayed = []
    mixed_replay = runner.mixed_graphs.replay
    runner.mixed_graphs.replay = lambda padded, n: (mixed_replayed.append((padded, n)), mixed_replay(padded, n))[1]
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert {p for p, _ in replayed} >= {12, 8} and any(p > b for p, b in replayed)   # padded replays ran
    assert mixed_replayed and any(p > n for p, n in mixed_replayed)                  # and prefill steps
    for prompt, param, out in zip(prompts, params, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_ref(prompt)[0][:param.max_tokens]


def test_tensor_parallel_2_on_gloo_matches_hf(tiny_qwen3_dir, hf_ref):
    prompts = _prompts([7, 40, 23], seed=10)
    llm = LLM(str(tiny_qwen3_dir), tensor_parallel_size=2)
    try:
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_ref(prompt)[0]


def test_check_logprobs_close_rule():
    same = [([1, 2, 3], [{1: -0.1, 9: -2.0}, {2: -0.2, 8: -2.0}, {3: -0.1}])]
    swapped = [([1, 8, 5], [{1: -0.1, 9: -2.0}, {8: -0.2, 2: -0.3}, {5: -0.1}])]
    check_logprobs_close(same, swapped)                 # 2 vs 8 each in the other's top-k: ok, then stop
    outside = [([1, 7, 3], [{1: -0.1}, {7: -0.1, 6: -0.5}, {3: -0.1}])]
    with pytest.raises(AssertionError):
        check_logprobs_close(same, outside)


# ---- GPU ------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_match_eager(make_tiny_checkpoint):
    """Decode graphs, the LM head + draw graphs and the piecewise graphs of prefill / mixed steps give the
    eager engine's tokens (greedy and seeded random rows)."""
    model_dir = make_tiny_checkpoint("qwen3", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=128, intermediate_size=512)
    prompts = _prompts([3, 17, 33, 50, 71, 5, 9, 12, 40, 2, 66], seed=7)
    params = [SamplingParams(temperature=0.0 if i % 3 else 0.8, seed=i, max_tokens=10 + 7 * i, ignore_eos=True)
              for i in range(len(prompts))]
    results = {}
    mixed_replayed = []
    head_replayed = []
    for eager in (True, False):
        # 4 sequences at a time: later prompts join running decodes (mixed steps)
        llm = LLM(str(model_dir), dtype="float32", enforce_eager=eager, gpu_memory_utilization=0.3, max_num_seqs=4)
        runner = llm.llm_engine.executor.runner
        assert runner.graphs.emulate == eager and runner.graphs.graphs
        heads = runner.head_graphs
        assert heads is not None and heads.emulate == eager and (eager or heads.graphs)
        if not eager:
            replay_head = heads.replay
            heads.replay = lambda padded, n, run=replay_head: (head_replayed.append((padded, n)), run(padded, n))[1]
        mixed = runner.mixed_graphs             # prefill and mixed steps: piecewise graphs unless eager
        assert (mixed is None) == eager
        if mixed is not None:
            assert not mixed.emulate and mixed.pieces
            replay = mixed.replay
            mixed.replay = lambda padded, n, replay=replay: (mixed_replayed.append((padded, n)), replay(padded, n))[1]
        results[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.shutdown()
    assert results[True] == results[False]
    assert len(mixed_replayed) >= 3 and any(padded > n for padded, n in mixed_replayed)
    assert len(head_replayed) >= 10 and any(padded > n for padded, n in head_replayed)


@pytest.fixture(scope="module")
def qwen3_06b_dir(tmp_path_factory):
    from nv_engine.model_loader.random_model import write_random_checkpoint

    # std 0.05: peaked next-token distributions, so bf16 rounding rarely reorders the top tokens
    return write_random_checkpoint(tmp_path_factory.mktemp("qwen3-0.6b") / "ckpt", "qwen3-0.6b",
                                   dtype="bfloat16", with_tokenizer=False, std=0.05)


def _bf16_follows_hf(model_dir, device: str, vocab: int, **llm_kwargs) -> None:
    prompts = _prompts([12, 100, 333, 37], seed=8, vocab=vocab)
    num_tokens, k = 32, 5
    llm = LLM(str(model_dir), dtype="bfloat16", device=device, max_model_len=1024, **llm_kwargs)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True,
                                                   logprobs=k), use_tqdm=False)
    llm.shutdown()
    hf = load_hf(model_dir, dtype=torch.bfloat16, device=device)
    refs = [hf_greedy(hf, p, num_tokens) for p in prompts]
    check_logprobs_close(nv_with_logprobs(outputs), hf_with_logprobs(refs, k), "nv", "hf")


def test_tiny_bf16_follows_hf_on_cpu(tmp_path):
    from nv_engine.model_loader.random_model import write_random_checkpoint

    model_dir = write_random_checkpoint(tmp_path / "tiny", "tiny", dtype="bfloat16", std=0.05)
    _bf16_follows_hf(model_dir, "cpu", vocab=512)


def _flash_attn_runs() -> bool:
    from nv_kernels import available_backends

    return torch.cuda.is_available() and "flash_attn" in available_backends()


needs_flash_attn = pytest.mark.skipif(not _flash_attn_runs(), reason="flash_attn does not run here")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend, block_size", [
    (None, None),
    pytest.param("flash_attn", None, marks=needs_flash_attn),   # FA4: pages gathered by cp.async
    pytest.param("flash_attn", 128, marks=needs_flash_attn),    # FA4: pages of one key tile, loaded by TMA
], ids=["default", "flash_attn", "flash_attn-bs128"])
def test_qwen3_06b_bf16_follows_hf(qwen3_06b_dir, backend, block_size):
    _bf16_follows_hf(qwen3_06b_dir, "cuda", vocab=151936, gpu_memory_utilization=0.4,
                     attention_backend=backend, block_size=block_size)


@pytest.mark.gpu
@needs_cuda
def test_gpu_memory_stays_under_utilization(qwen3_06b_dir):
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    others = total - free_before
    utilization = 0.5
    llm = LLM(str(qwen3_06b_dir), gpu_memory_utilization=utilization, max_model_len=4096)
    prompts = _prompts([1000] * 64 + [3000] * 4, seed=9, vocab=151936)
    llm.generate(prompts, SamplingParams(temperature=0.6, max_tokens=64, ignore_eos=True), use_tqdm=False)
    free_after, _ = torch.cuda.mem_get_info()
    used = total - free_after
    llm.shutdown()
    assert used <= utilization * total + 512 * 2**20, (used / 2**30, others / 2**30, total / 2**30)
