"""ModelRunner on CPU: KV-cache sizing, cache layout, steps with and without sampling rows, the
CUDA-graph input layout (emulated graphs) against eager steps."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.sampling_batch import SamplingBatchBuilder
from nv_engine.core.step_builder import StepBuilder
from nv_engine.runner.cuda_graphs import DecodeGraphs
from nv_engine.runner.head_graphs import SampledHeadGraphs
from nv_engine.runner.memory import MemoryProfile, graph_reserve
from nv_engine.runner.mixed_graphs import MixedStepGraphs
from nv_engine.runner.model_runner import ModelRunner
from nv_engine.sampling_params import SamplingParams
from nv_kvcache import Scheduler, Sequence, StopRules


def _tiny_config(tiny_model_dir) -> EngineConfig:
    """CPU, at most 8 sequences (decode graph sizes 1 / 2 / 4 / 8), blocks of 16."""
    return EngineArgs(str(tiny_model_dir), device="cpu", max_model_len=256, max_num_seqs=8,
                      block_size=16).create_engine_config()


def _record_replays(graphs: DecodeGraphs | MixedStepGraphs | SampledHeadGraphs) -> list[tuple[int, int]]:
    """Wrap graphs.replay(padded, n) so that each call appends its (padded, n) to the list returned."""
    calls: list[tuple[int, int]] = []
    replay = graphs.replay

    def recorded(padded: int, n: int) -> torch.Tensor:
        calls.append((padded, n))
        return replay(padded, n)

    graphs.replay = recorded
    return calls


@contextlib.contextmanager
def _emulated_graph_runner(config: EngineConfig) -> Iterator[ModelRunner]:
    """A runner with 64 KV blocks and its CUDA graphs captured in emulation (CPU); shut down on exit."""
    graph_runner = ModelRunner(config, 0)
    try:
        graph_runner.allocate_kv_cache(64)
        graph_runner.capture_cudagraphs(emulate=True)
        yield graph_runner
    finally:
        graph_runner.shutdown()


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    config = _tiny_config(tiny_model_dir)
    r = ModelRunner(config, 0)
    yield r
    r.shutdown()


def test_kv_cache_size_and_layout(runner):
    hf = runner.config.hf_config
    per_block = 2 * runner.config.block_size * hf.num_key_value_heads * hf.head_dim * 4 * hf.num_hidden_layers
    assert runner.kv_block_bytes() == per_block
    assert runner.determine_num_blocks() == 8 * 256 // 16          # every sequence at full length
    default_config = runner.config
    runner.config = dataclasses.replace(default_config, cpu_kv_cache_space_gib=10 * per_block / 2**30)
    try:
        assert runner.determine_num_blocks() == 10                  # the CPU budget caps the cache
    finally:
        runner.config = default_config
    with pytest.raises(ValueError, match="cpu_kv_cache_space_gib"):
        dataclasses.replace(default_config, cpu_kv_cache_space_gib=0).validate()
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
    runner.allocate_kv_cache(32)
    with torch.inference_mode():
        runner.memory_profiler.dummy_prefill(300, 8)        # two sequences: 256 (max_model_len) + 44 tokens
        runner.memory_profiler.dummy_decode(8)
    assert runner.attention_layers[0].k_cache.shape[0] == 32          # the real cache is back


def _greedy_run(runner: ModelRunner, prompts: list[list[int]], max_tokens: list[int],
                params: list[SamplingParams] | None = None) -> tuple[list[list[int]], list[list[float]]]:
    """Run the prompts to completion through runner.execute over the runner's 64-block cache;
    each sequence's greedy ids and their logprobs (params: each sequence's own instead, seeded by its index)."""
    sched = Scheduler(num_blocks=64, block_size=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
    builder = StepBuilder(16, runner.config.max_blocks_per_seq)
    sampling = SamplingBatchBuilder(runner.config.hf_config.vocab_size)
    seqs = [Sequence(list(p), StopRules(max_tokens=n, ignore_eos=True))
            for p, n in zip(prompts, max_tokens, strict=True)]
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    row_params = {seq.seq_id: (params[i] if params else greedy, 1000 + i) for i, seq in enumerate(seqs)}
    logprobs: dict[int, list[float]] = {seq.seq_id: [] for seq in seqs}
    for seq in seqs:
        sched.add(seq)
    while sched.has_unfinished():
        out = sched.schedule()
        rows = [(*row_params[s.seq.seq_id], s.seq.num_output_tokens) for s in out.sampling]
        batch = sampling.build(rows) if rows else None
        result = runner.execute(builder.build(out, batch))
        for s, logprob in zip(out.sampling, result.logprobs or [], strict=False):
            logprobs[s.seq.seq_id].append(logprob)
        sched.postprocess(out, result.token_ids)
    return [list(seq.output_token_ids) for seq in seqs], [logprobs[seq.seq_id] for seq in seqs]


def test_emulated_decode_graphs_match_eager(tiny_model_dir):
    """Decode batches through the CUDA-graph layout (staged at fixed addresses, padded to the captured
    sizes with slot -1 / length 0 rows, context bound max_model_len), and prefill / mixed steps through
    the piecewise graphs' layout (padded ids / positions / slots, q and the attention output in shared
    static buffers, attention on the real rows only), sample the same greedy ids, with the same
    logprobs, as eager steps."""
    config = _tiny_config(tiny_model_dir)
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate([5, 17, 33, 2, 40, 9, 21])]
    max_tokens = [4, 12, 7, 20, 3, 15, 9]
    eager_runner = ModelRunner(config, 0)
    try:
        eager_runner.allocate_kv_cache(64)
        eager_ids, eager_logprobs = _greedy_run(eager_runner, prompts, max_tokens)
    finally:
        eager_runner.shutdown()
    with _emulated_graph_runner(config) as graph_runner:
        graphs = graph_runner.graphs
        assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8]
        replayed = _record_replays(graphs)
        mixed = graph_runner.mixed_graphs
        assert mixed is not None and mixed.sizes[0] == 16
        assert mixed.sizes[-1] == min(config.max_num_batched_tokens, 2048)
        mixed_replayed = _record_replays(mixed)
        graph_ids, graph_logprobs = _greedy_run(graph_runner, prompts, max_tokens)
    assert [len(ids) for ids in eager_ids] == [len(lps) for lps in eager_logprobs] == max_tokens
    assert graph_ids == eager_ids
    for eager_lps, graph_lps in zip(eager_logprobs, graph_logprobs, strict=True):
        assert graph_lps == pytest.approx(eager_lps, abs=1e-5)
    assert any(padded > batch for padded, batch in replayed)          # padding rows ran
    assert {padded for padded, _ in replayed} >= {8, 4, 1}
    # prefill and mixed steps ran through the piecewise-graph path, padded
    assert mixed_replayed and all(padded > n for padded, n in mixed_replayed)


def test_emulated_head_graphs_draw_as_the_eager_sampler(tiny_model_dir):
    """Decode steps whose rows need only a temperature (greedy and seeded random rows mixed) take the LM head
    and draw of the head graphs (staged temperatures, seeds and positions, padded rows), and draw exactly the
    ids of the eager LM head and sampler; a step with a row that needs more (top-p) still samples eagerly."""
    config = _tiny_config(tiny_model_dir)
    prompts = [[(5 * i + 11 * j) % 500 + 1 for j in range(n)] for i, n in enumerate([6, 19, 3, 28, 11])]
    max_tokens = [9, 14, 6, 11, 8]
    params = [SamplingParams(temperature=t, seed=7) for t in (0.0, 0.9, 1.3, 0.0, 0.6)]
    filtered = [*params[:4], SamplingParams(temperature=0.9, top_p=0.5, seed=7)]
    results = {}
    for use_head_graphs in (True, False):
        with _emulated_graph_runner(config) as runner:
            heads = runner.head_graphs
            assert heads is not None and sorted(heads.runs) == [1, 2, 4, 8]
            if not use_head_graphs:
                runner.head_graphs = None
            replayed = _record_replays(heads)
            ids, _ = _greedy_run(runner, prompts, max_tokens, params)
            results[use_head_graphs] = ids
            if use_head_graphs:
                assert any(padded > batch for padded, batch in replayed)
                assert {padded for padded, _ in replayed} >= {8, 4, 1}
                replayed.clear()
                with_filter, _ = _greedy_run(runner, prompts, max_tokens, filtered)
                # the top-p row decodes alongside the others until its last token: no head graph then
                assert all(batch < 4 for _, batch in replayed)
                assert [len(i) for i in with_filter] == max_tokens
            else:
                assert not replayed
    assert [len(i) for i in results[True]] == max_tokens
    assert results[True] == results[False]


@pytest.mark.parametrize(("mode", "mixed", "head"), [("full_and_piecewise", True, True),
                                                      ("full_decode_only", False, True)])
def test_cuda_graph_mode_picks_the_graphs_captured(tiny_model_dir, mode, mixed, head):
    """full_and_piecewise captures the decode graphs, the head graphs and the mixed steps' pieces;
    full_decode_only the decode and head graphs only (mixed steps then run eagerly)."""
    config = dataclasses.replace(_tiny_config(tiny_model_dir), cuda_graph_mode=mode)
    with _emulated_graph_runner(config) as graph_runner:
        assert graph_runner.graphs is not None and graph_runner.graphs.sizes == [1, 2, 4, 8]
        assert (graph_runner.mixed_graphs is not None) is mixed
        assert (graph_runner.head_graphs is not None) is head


@pytest.mark.parametrize("mode", ["off", "on", "auto"])
def test_runner_applies_the_fused_ops_argument(tiny_model_dir, mode):
    import nv_kernels

    previous = nv_kernels.get_fused_ops()
    try:
        ModelRunner(dataclasses.replace(_tiny_config(tiny_model_dir), fused_ops=mode), 0).shutdown()
        assert nv_kernels.get_fused_ops() == mode
    finally:
        nv_kernels.set_fused_ops(previous)
