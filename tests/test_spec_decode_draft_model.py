"""Speculative decoding with a draft model end to end on CPU.

- Greedy output token-identical with and without drafts, with the target as its own draft (every draft accepted)
  and with a different tiny draft of the same vocabulary (fewer accepted); plain, prefix caching, forced
  preemption, chunked prefill; k = 8 at a full token budget (the runner's staging must hold S * (k+1) rows).
- Sampling at temperature 1: the first generated tokens' distribution with drafts matches the one without (a
  chi-square two-sample test), and the same test rejects a broken rejection rule.
- The engine arguments: LLM keyword, `nv serve --speculative-config`, errors for a draft that cannot serve;
  `/metrics` of `nv serve` counting drafted and accepted tokens.
- The adaptive draft length: a draft that disagrees with the target is turned off after the first steps (the
  steps run without it, pipelined), one that is always accepted keeps drafting k.
- In emulated CUDA graphs (CPU): a drafting step of decodes replays graphs only (the draft's catch-up included);
  a draft that lags after steps without drafts catches up eagerly once.
- On CUDA (`-m gpu`): the same greedy equality through the CUDA graphs.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from nv_engine import LLM, EngineArgs, SamplingParams
from nv_engine.runner.cuda_graphs import DecodeGraphs
from nv_kvcache import SchedulerStats

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # tests/conftest.py

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
VARIANTS = {      # "prefix-cache" generates twice: the second round hits the cached prompt blocks
    "plain": {"enable_prefix_caching": False},
    "prefix-cache": {"enable_prefix_caching": True, "block_size": 16},
    "preemption": {"num_gpu_blocks_override": 8, "block_size": 16, "max_model_len": 96},
    "chunked-prefill": {"max_num_batched_tokens": 16, "block_size": 8},
}


def prompts(vocab: int) -> list[list[int]]:
    """Four prompts: repeated patterns of several lengths, the last two sharing their first 24 tokens."""
    base = [([(7 * i + j * 13) % (vocab - 1) + 1 for j in range(5)] * 8)[: 20 + 5 * i] for i in range(3)]
    return [*base, base[2][:24] + [3, 1, 4, 1, 5, 9, 2, 6]]


def generate(model_dir, token_prompts, params, **kwargs) -> tuple[list[list[int]], SchedulerStats]:
    """The outputs (of both rounds when prefix caching is asked for) and the scheduler's counters."""
    llm = LLM(str(model_dir), **kwargs)
    try:
        rounds = 2 if kwargs.get("enable_prefix_caching") else 1
        outputs = [o.outputs[0].token_ids for _ in range(rounds)
                   for o in llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)]
        stats = llm.llm_engine.scheduler.stats()
        if rounds == 2:
            assert stats.prefix_cache_hits > 0
        return outputs, stats
    finally:
        llm.shutdown()


def draft_config(draft_dir, k: int = 3, **extra) -> dict:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k, **extra}


@pytest.fixture(scope="module")
def other_draft_dir(make_tiny_checkpoint):
    """A smaller random Qwen3 with the target's vocabulary (and tokenizer)."""
    return make_tiny_checkpoint("qwen3", seed=7, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def references(tiny_qwen3_dir) -> dict[str, list[list[int]]]:
    """Greedy outputs without speculation, per variant, computed once."""
    return {name: generate(tiny_qwen3_dir, prompts(384), GREEDY, **kwargs)[0] for name, kwargs in VARIANTS.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_target_as_its_own_draft_accepts_every_draft(tiny_qwen3_dir, references, variant):
    kwargs = VARIANTS[variant]
    spec, stats = generate(tiny_qwen3_dir, prompts(384), GREEDY, speculative_config=draft_config(tiny_qwen3_dir),
                           **kwargs)
    assert spec == references[variant]
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    if variant == "preemption":
        assert stats.num_preemptions > 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_other_draft_is_lossless(tiny_qwen3_dir, other_draft_dir, references, variant):
    kwargs = VARIANTS[variant]
    spec, stats = generate(tiny_qwen3_dir, prompts(384), GREEDY, speculative_config=draft_config(other_draft_dir),
                           **kwargs)
    assert spec == references[variant]
    assert stats.num_draft_tokens > stats.num_accepted_tokens
    if variant == "preemption":
        assert stats.num_preemptions > 0


def test_eight_drafts_at_a_full_token_budget(tiny_qwen3_dir):
    """64 sequences x (1 + 8 drafts) = the whole budget of 576 tokens: 576 verified rows, more than the staging
    buffer held before it was sized for S * (k+1)."""
    token_prompts = [[(5 * i + 3 * j) % 380 + 1 for j in range(6)] for i in range(64)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    kwargs = {"max_num_seqs": 64, "max_num_batched_tokens": 576, "block_size": 16}
    reference, _ = generate(tiny_qwen3_dir, token_prompts, params, **kwargs)
    spec, stats = generate(tiny_qwen3_dir, token_prompts, params, **kwargs,
                           speculative_config=draft_config(tiny_qwen3_dir, k=8, max_batch_size=64))
    assert spec == reference
    assert stats.num_accepted_tokens == stats.num_draft_tokens >= 64 * 8


def test_smollm2_as_its_own_draft(smollm2_dir):
    """One engine (SmolLM2 loads in seconds): the reference is a request with logprobs, which turns drafting off."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    batch = [{"prompt_token_ids": tokenizer("The capital of France is")["input_ids"]}]
    llm = LLM(str(smollm2_dir), max_model_len=128, speculative_config=draft_config(smollm2_dir, k=4))
    try:
        reference = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=12, logprobs=1), use_tqdm=False)
        assert llm.llm_engine.scheduler.stats().num_draft_tokens == 0
        spec = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert spec[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0


def test_verification_in_emulated_graphs(tiny_qwen3_dir, references):
    """The CUDA-graph input path on CPU (replays run eagerly from the static staging addresses): a verifying step
    replays a verify graph with the drafts written into its staged input ids (at their rows of the fixed layout),
    and the draft's proposal forwards replay its own decode graphs (padded batches included)."""
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=False, speculative_config=draft_config(tiny_qwen3_dir))
    runner = llm.llm_engine.executor.runner
    runner.capture_cudagraphs(emulate=True)
    replayed: list[int] = []
    replay = runner.verify_graphs.replay
    runner.verify_graphs.replay = lambda padded, n: (replayed.append(n), replay(padded, n))[1]
    draft_replayed: list[tuple[int, int]] = []
    draft_graphs = runner.draft_runner.graphs
    draft_replay = draft_graphs.replay
    draft_graphs.replay = lambda padded, n: (draft_replayed.append((padded, n)), draft_replay(padded, n))[1]
    lengths = [24, 10, 24, 16]                 # sequences that finish early leave padded proposal batches
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts(384)], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    expected = [r[:n] for r, n in zip(references["plain"], lengths, strict=True)]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert sum(n == 4 for n in replayed) > 1                    # 4 sequences x (last token + 3 drafts)
    assert len(draft_replayed) > 6 and any(padded > n for padded, n in draft_replayed)


def draft_forwards_per_step(llm: LLM, requests: list[list[int]], params,
                            monkeypatch: pytest.MonkeyPatch) -> tuple[list, list[tuple[bool, int, int]]]:
    """Generate with emulated CUDA graphs captured (a replay runs the model once); per launched step: (whether it
    drafts, forwards of the draft model outside any graph replay, its forwards in graphs of several rows per
    sequence: catch-ups)."""
    runner = llm.llm_engine.executor.runner
    runner.capture_cudagraphs(emulate=True)
    replaying: list[int] = []                 # rows per sequence of the graph replaying now
    replay = DecodeGraphs.replay

    def replay_marked(graphs: DecodeGraphs, padded: int, n: int) -> torch.Tensor:
        replaying.append(graphs.rows)
        try:
            return replay(graphs, padded, n)
        finally:
            replaying.pop()

    monkeypatch.setattr(DecodeGraphs, "replay", replay_marked)
    counts = {"eager": 0, "several rows": 0}
    model = runner.draft_runner.model
    forward = model.forward

    def forward_counted(*args, **kwargs):
        if not replaying:
            counts["eager"] += 1
        elif replaying[-1] > 1:
            counts["several rows"] += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward_counted)
    steps: list[tuple[bool, int, int]] = []
    launch = runner.launch

    def launch_counted(step):
        before = dict(counts)
        launch(step)
        steps.append((step.draft_ids is not None, counts["eager"] - before["eager"],
                      counts["several rows"] - before["several rows"]))

    monkeypatch.setattr(runner, "launch", launch_counted)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
    finally:
        llm.shutdown()
    return [o.outputs[0].token_ids for o in outputs], steps


def test_decode_drafting_steps_replay_only_graphs(tiny_qwen3_dir, references, monkeypatch):
    """On CUDA a drafting step of decodes at small batch replays graphs only: the draft's catch-up (1 or 2 tokens per
    sequence) a catch-up graph, its proposals decode graphs; only the prompt step runs the draft eagerly."""
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=False, speculative_config=draft_config(tiny_qwen3_dir))
    outputs, steps = draft_forwards_per_step(llm, prompts(384), GREEDY, monkeypatch)
    assert outputs == references["plain"]
    drafting = [(eager, catchups) for drafts, eager, catchups in steps if drafts]
    assert len(drafting) > 4
    assert all(eager == 0 and catchups == 1 for eager, catchups in drafting)
    assert sum(eager for _, eager, _ in steps) == 1                        # the prompts' step


def test_a_lagging_draft_catches_up_eagerly(tiny_qwen3_dir, references, monkeypatch):
    """max_batch_size 2: while 3 or 4 sequences run no step drafts and the draft skips them, so the first drafting
    step's catch-up is longer than 1 + k tokens per sequence: it runs eagerly, the next ones in graphs; the output
    is still the output without drafts."""
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=False,
              speculative_config=draft_config(tiny_qwen3_dir, max_batch_size=2))
    lengths = [24, 6, 24, 8]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outputs, steps = draft_forwards_per_step(llm, prompts(384), params, monkeypatch)
    assert outputs == [r[:n] for r, n in zip(references["plain"], lengths, strict=True)]
    drafting = [(eager, catchups) for drafts, eager, catchups in steps if drafts]
    assert drafting[0] == (1, 0)
    assert len(drafting) > 2 and all(step == (0, 1) for step in drafting[1:])


def record_steps(llm: LLM) -> list[tuple[str, int, bool]]:
    """Wrap the core's executor: per step (path, draft tokens, whether the draft model runs in it), path
    "pipelined" for a step launched while the previous one is still uncollected, else "alone"."""
    core = llm.llm_engine.core
    steps: list[tuple[str, int, bool]] = []
    executor = core.executor
    launch, execute = executor.launch, executor.execute

    def entry(step, path: str) -> tuple[str, int, bool]:
        drafts = 0 if step.num_drafts is None else int(step.num_drafts.sum())
        return path, drafts, step.draft is not None

    def launched(step):
        steps.append(entry(step, "pipelined" if core._num_uncollected else "alone"))
        return launch(step)

    def executed(step):
        steps.append(entry(step, "alone"))
        return execute(step)

    executor.launch, executor.execute = launched, executed
    return steps


@pytest.fixture(scope="module")
def losing_draft_dir(make_tiny_checkpoint):
    """A random Qwen3 of the target's shape and vocabulary whose greedy tokens the target (nearly) never shares."""
    return make_tiny_checkpoint("qwen3", seed=3)


def test_a_losing_draft_is_turned_off_and_steps_pipeline(tiny_qwen3_dir, losing_draft_dir):
    """A draft that disagrees with the target (k = 3): each sequence stops drafting after its first drafting step
    and drafts again only in probes after a growing backoff; meanwhile the steps run without the draft model and
    pipeline like plain decoding. Greedy output equals the output without speculation."""
    token_prompts = prompts(384)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    reference, _ = generate(tiny_qwen3_dir, token_prompts, params)
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=False, speculative_config=draft_config(losing_draft_dir))
    assert llm.llm_engine.core.async_scheduling
    steps = record_steps(llm)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert stats.num_accepted_tokens < 0.2 * stats.num_draft_tokens, "the premise: a draft that disagrees"
    later = steps[8:]
    assert sum(drafts for _, drafts, _ in later) < 0.1 * 3 * 2 * len(later)      # k = 3, 2 sequences
    assert sum(path == "pipelined" for path, _, _ in steps) > 0.7 * len(steps)
    assert sum(runs_draft for _, _, runs_draft in steps) < 0.2 * len(steps)


def test_a_draft_that_is_always_accepted_keeps_drafting_k(tiny_qwen3_dir, references):
    """The target as its own draft: every draft is accepted, so the adaptive length drafts as many tokens as a
    fixed one (k per sequence and step, or what max_tokens leaves) and no step runs without drafts."""
    _, fixed = generate(tiny_qwen3_dir, prompts(384), GREEDY, enable_prefix_caching=False,
                        speculative_config=draft_config(tiny_qwen3_dir, adaptive_draft_length=False))
    llm = LLM(str(tiny_qwen3_dir), enable_prefix_caching=False, speculative_config=draft_config(tiny_qwen3_dir))
    steps = record_steps(llm)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts(384)], GREEDY, use_tqdm=False)
        stats = llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == references["plain"]
    assert stats.num_accepted_tokens == stats.num_draft_tokens == fixed.num_draft_tokens > 0
    assert all(drafts > 0 for _, drafts, _ in steps[1:])                 # after the prompts' step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_draft_model_on_cuda(make_tiny_checkpoint):
    """On CUDA (graphs captured; the verifying steps replay the verify graphs, the draft its decode graphs): greedy
    output with a draft equals the output without, the target as its own draft has (nearly) every draft accepted
    in fp32, and sampled drafting is reproducible with seeds."""
    shape = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=512)
    target = make_tiny_checkpoint("qwen3", **shape)
    draft = make_tiny_checkpoint("qwen3", seed=5, **{**shape, "num_hidden_layers": 1})
    kwargs = {"dtype": "float32", "gpu_memory_utilization": 0.3, "max_num_seqs": 8}
    reference, _ = generate(target, prompts(384), GREEDY, **kwargs)
    for draft_dir in (target, draft):
        spec, stats = generate(target, prompts(384), GREEDY, speculative_config=draft_config(draft_dir, k=4),
                               **kwargs)
        assert spec == reference
        assert stats.num_draft_tokens > 0
        if draft_dir == target:
            assert stats.num_accepted_tokens >= 0.95 * stats.num_draft_tokens
    params = SamplingParams(temperature=0.8, top_k=50, seed=3, max_tokens=24, ignore_eos=True)
    sampled = draft_config(draft, k=4, draft_sampling="sampled")
    first, stats = generate(target, prompts(384), params, speculative_config=sampled, **kwargs)
    again, _ = generate(target, prompts(384), params, speculative_config=sampled, **kwargs)
    assert first == again and stats.num_draft_tokens > 0


# ---- sampling: the distribution is kept ------------------------------------------------------------------------
SAMPLES = 2000
STAT_PROMPT = [1, 5, 9, 3, 7, 2, 11, 4]


def chi_square_critical(df: int, z: float = 3.72) -> float:
    """The chi-square quantile at one-sided normal quantile z (3.72: p = 1e-4), Wilson-Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def two_sample_chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the homogeneity test of two equal-size samples' counts."""
    keys = sorted(set(a) | set(b))
    stat = sum((a[key] - b[key]) ** 2 / (a[key] + b[key]) for key in keys)
    return stat, len(keys) - 1


@pytest.fixture(scope="module")
def tiny_vocab_dir(make_tiny_checkpoint):
    """Vocabulary 16, weights std 0.3: peaked enough that a greedy draft is accepted about half the time at T = 1."""
    return make_tiny_checkpoint("qwen3", with_tokenizer=False, vocab_size=16, initializer_range=0.3)


@pytest.fixture(scope="module")
def tiny_vocab_draft_dir(make_tiny_checkpoint):
    """Another model of vocabulary 16 (other weights, one layer): its q differs from the target's p."""
    return make_tiny_checkpoint("qwen3", seed=3, with_tokenizer=False, vocab_size=16, initializer_range=0.3,
                                num_hidden_layers=1)


def sampled_tokens(model_dir, **kwargs) -> tuple[list[list[int]], SchedulerStats]:
    """SAMPLES seeded completions of 4 tokens of one prompt; tokens 2 and 3 come from the step that verifies the
    drafts (2 drafts per sequence) when speculating."""
    params = [SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=seed) for seed in range(SAMPLES)]
    llm = LLM(str(model_dir), max_num_seqs=256, **kwargs)
    try:
        outputs = llm.generate([{"prompt_token_ids": STAT_PROMPT}] * SAMPLES, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], llm.llm_engine.scheduler.stats()
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def plain_samples(tiny_vocab_dir) -> list[list[int]]:
    return sampled_tokens(tiny_vocab_dir)[0]


def distribution_gap(plain: list[list[int]], spec: list[list[int]], position: int) -> tuple[float, float]:
    """(chi-square statistic, its critical value at p = 1e-4) for the tokens at `position`."""
    stat, df = two_sample_chi_square(Counter(t[position] for t in plain), Counter(t[position] for t in spec))
    return stat, chi_square_critical(df)


@pytest.mark.parametrize(("draft", "draft_sampling", "acceptance"), [
    ("self", "greedy", (0.2, 0.9)),      # p(argmax p): about 0.45 here
    ("self", "sampled", (0.97, 1.0)),    # q = p: every draft accepted, up to rounding
    ("other", "sampled", (0.05, 0.95)),  # 1 - TV(p, q): about 0.13 here
])
def test_sampling_keeps_the_distribution(tiny_vocab_dir, tiny_vocab_draft_dir, plain_samples, draft, draft_sampling,
                                         acceptance):
    draft_dir = tiny_vocab_dir if draft == "self" else tiny_vocab_draft_dir
    spec, stats = sampled_tokens(tiny_vocab_dir, speculative_config=draft_config(
        draft_dir, k=2, max_batch_size=256, draft_sampling=draft_sampling))
    low, high = acceptance
    assert low * stats.num_draft_tokens <= stats.num_accepted_tokens <= high * stats.num_draft_tokens
    for position in (1, 2):
        stat, critical = distribution_gap(plain_samples, spec, position)
        assert stat < critical, f"token {position}: chi-square {stat:.1f} >= {critical:.1f}"


def test_sampled_drafts_are_reproducible_with_seeds(tiny_qwen3_dir, other_draft_dir):
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=16, ignore_eos=True)
    spec = draft_config(other_draft_dir, draft_sampling="sampled")
    first, stats = generate(tiny_qwen3_dir, prompts(384), params, speculative_config=spec)
    again, _ = generate(tiny_qwen3_dir, prompts(384), params, speculative_config=spec)
    assert first == again and stats.num_draft_tokens > 0


def test_the_distribution_check_rejects_a_broken_rule(tiny_vocab_dir, plain_samples, monkeypatch):
    """A residual that keeps the rejected draft (p instead of norm(max(p - q, 0))) over-samples the drafts."""
    from nv_layers.rejection_sampler import RejectionSampler

    monkeypatch.setattr(RejectionSampler, "_residual", staticmethod(lambda probs, drafts, has_draft: probs))
    spec, _ = sampled_tokens(tiny_vocab_dir, speculative_config=draft_config(tiny_vocab_dir, k=2, max_batch_size=256))
    stat, critical = distribution_gap(plain_samples, spec, 1)
    assert stat > critical


# ---- arguments -------------------------------------------------------------------------------------------------
def test_model_without_method_means_draft_model(tiny_qwen3_dir):
    config = EngineArgs(model=str(tiny_qwen3_dir), speculative_config={"model": str(tiny_qwen3_dir)}) \
        .create_engine_config()
    assert config.speculative_config is not None
    assert config.speculative_config.method == "draft_model"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tensor_parallel_size": 2}, "draft_model needs tensor_parallel_size 1 for now"),
    ({"max_model_len": 512, "draft": {"max_position_embeddings": 256}}, "handles 256 positions"),
    ({"draft": {"vocab_size": 400}}, "has vocab_size 400, the target 384"),
])
def test_a_draft_that_cannot_serve_is_refused(tiny_qwen3_dir, make_tiny_checkpoint, kwargs, message):
    kwargs = dict(kwargs)
    draft = make_tiny_checkpoint("qwen3", num_hidden_layers=1, **kwargs.pop("draft", {}))
    with pytest.raises(ValueError, match=message):
        EngineArgs(model=str(tiny_qwen3_dir), speculative_config=draft_config(draft), **kwargs).create_engine_config()


def test_server_reports_acceptance_in_metrics(tiny_qwen3_dir, references):
    """`nv serve`'s app on AsyncLLM (the engine core in its own process) with the target as its own draft: the
    greedy completion is the one without drafts, and /metrics counts the drafted and accepted tokens."""
    from types import SimpleNamespace

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from prometheus_client.parser import text_string_to_metric_families

    from nv_engine.entrypoints.server.cli import build_app_for_engine, create_async_llm
    from nv_engine.entrypoints.server.testing import serve_in_thread

    llm = create_async_llm(str(tiny_qwen3_dir), device="cpu", enable_prefix_caching=False,
                           speculative_config=draft_config(tiny_qwen3_dir))
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=["tiny"], api_key=None, max_n=1)
    try:
        with serve_in_thread(build_app_for_engine(llm, args)) as url:
            body = {"model": "tiny", "prompt": prompts(384)[0], "max_tokens": GREEDY.max_tokens, "temperature": 0,
                    "ignore_eos": True}
            completion = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
            text = httpx.get(url + "/metrics", timeout=10).text
    finally:
        llm.shutdown()
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir)).decode(references["plain"][0])
    assert completion["usage"]["completion_tokens"] == GREEDY.max_tokens
    assert completion["choices"][0]["text"] == expected.rstrip("\ufffd")   # a trailing partial character waits
    values = {sample.name: sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples}
    drafted = values["vllm:spec_decode_num_draft_tokens_total"]
    assert drafted > 0 and values["vllm:spec_decode_num_accepted_tokens_total"] == drafted


def test_serve_flag_and_llm_keyword(tiny_qwen3_dir):
    import argparse

    from nv_engine.entrypoints.server.cli import add_serve_parser, engine_kwargs

    value = f'{{"method": "draft_model", "model": "{tiny_qwen3_dir}", "num_speculative_tokens": 2}}'
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    kwargs = engine_kwargs(parser.parse_args(["serve", str(tiny_qwen3_dir), "--speculative-config", value]))
    assert kwargs["speculative_config"]["model"] == str(tiny_qwen3_dir)
    config = EngineArgs(model=str(tiny_qwen3_dir), **kwargs).create_engine_config()
    assert config.speculative_config is not None and config.speculative_config.num_speculative_tokens == 2
