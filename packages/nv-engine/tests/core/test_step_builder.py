"""StepBuilder (SchedulerOutput -> numpy StepInput) against a per-token Python reference, over a
random workload with chunked prefill, prefix-cache hits, preemption and aborts; StagingBuffer and
the CUDA-graph batch sizes."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from nv_engine.core.block_table_cache import BlockTableCache
from nv_engine.core.step import PLACEHOLDER_TOKEN
from nv_engine.core.step_builder import StepBuilder
from nv_engine.runner.cuda_graphs import DecodeGraphs, graph_batch_sizes
from nv_engine.runner.staging_buffer import StagingBuffer
from nv_kvcache import Scheduler, Sequence, StopRules


def _reference(out, block_size: int) -> dict:
    ids, positions, slots, seq_lens, logits_indices, tables = [], [], [], [], [], []
    for entry in out.scheduled:
        seq, start = entry.seq, entry.seq.num_computed_tokens
        for p in range(start, start + entry.num_new_tokens):
            ids.append(seq.token_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
        seq_lens.append(start + entry.num_new_tokens)
        tables.append(list(seq.block_table))
        if entry.samples:
            logits_indices.append(len(ids) - 1)
    return dict(ids=ids, positions=positions, slots=slots, seq_lens=seq_lens, logits_indices=logits_indices,
                tables=tables)


def _scheduler_with_requests(block_size: int, budget: int, rng: random.Random, count: int
                             ) -> tuple[Scheduler, StepBuilder, list[Sequence]]:
    """A small scheduler (preempts under this load) with `count` requests added, every other one sharing a
    24-token prefix, and a StepBuilder for it."""
    sched = Scheduler(num_blocks=max(12, 160 // block_size), block_size=block_size, max_num_seqs=8,
                      max_num_batched_tokens=budget, max_model_len=128)
    builder = StepBuilder(block_size, -(-128 // block_size))
    prefix = [rng.randrange(1, 500) for _ in range(24)]
    live: list[Sequence] = []
    for i in range(count):
        prompt = (prefix if i % 2 else []) + [rng.randrange(1, 500) for _ in range(rng.randint(1, 40))]
        seq = Sequence(prompt, StopRules(max_tokens=rng.randint(1, 30), ignore_eos=True))
        sched.add(seq)
        live.append(seq)
    return sched, builder, live


@pytest.mark.parametrize("block_size,budget,seed", [(16, 64, 0), (4, 32, 1), (16, 1024, 2), (1, 16, 3)])
def test_step_builder_matches_reference(block_size, budget, seed):
    rng = random.Random(seed)
    sched, builder, live = _scheduler_with_requests(block_size, budget, rng, 12)
    preempted = steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        preempted += len(out.preempted)
        step = builder.build(out)
        ref = _reference(out, block_size)
        assert step.input_ids.tolist() == ref["ids"]
        assert step.positions.tolist() == ref["positions"]
        assert step.slot_mapping.tolist() == ref["slots"]
        assert step.seq_lens.tolist() == ref["seq_lens"]
        assert step.cu_seqlens_q[-1] == len(ref["ids"]) and step.cu_seqlens_q[0] == 0
        assert step.is_decode == out.is_pure_decode
        if not step.is_decode:
            assert step.logits_indices.tolist() == ref["logits_indices"]
        assert step.max_seqlen_k == max(ref["seq_lens"])
        for row, table in zip(step.block_tables, ref["tables"], strict=True):
            needed = -(-step.max_seqlen_k // block_size)
            assert row[:min(len(table), needed)].tolist() == table[:needed]
        finished = sched.postprocess(out, [rng.randrange(1, 500) for _ in out.sampling])
        for seq in finished:
            builder.release(seq.seq_id)
        steps += 1
        if steps % 7 == 0 and sched.num_running:            # abort one running sequence now and then
            victim = next(s for s in live if not s.is_finished and s.block_table)
            sched.abort(victim.seq_id)
            builder.release(victim.seq_id)
    assert preempted > 0 or seed == 2


@pytest.mark.parametrize("block_size,budget,seed", [(16, 64, 0), (4, 32, 1), (16, 1024, 2)])
def test_placeholders_take_the_previous_steps_samples(block_size, budget, seed):
    """Async scheduling: step N+1 is built before step N's ids are back (step N postprocessed with
    placeholders). Every placeholder input of N+1 must read the sampled row of its own sequence in
    step N, through preemption, aborts, prefix hits and chunked prefill; the rest of each step must
    still match the per-token reference, and a step that follows nothing has no placeholder rows."""
    rng = random.Random(seed)
    sched, builder, live = _scheduler_with_requests(block_size, budget, rng, 14)
    previous = None                     # (SchedulerOutput, its sampled ids) not yet resolved
    mapped = preempted = 0
    while sched.has_unfinished() or previous is not None:
        out = sched.schedule()
        preempted += len(out.preempted)
        if out.is_empty:
            step = None
        else:
            step = builder.build(out, follows_previous=previous is not None)
            ref = _reference(out, block_size)
            positions = {row: i for i, row in enumerate(step.logits_indices.tolist())}
            expected_rows, expected_src = [], []
            if previous is not None:
                sampled_before = {entry.seq.seq_id: j for j, entry in enumerate(previous[0].sampling)}
                for entry, row in zip(out.sampling, step.logits_indices.tolist(), strict=True):
                    if entry.seq.token_ids[-1] == PLACEHOLDER_TOKEN:
                        expected_rows.append(row)
                        expected_src.append(sampled_before[entry.seq.seq_id])
            got_rows = [] if step.prev_rows is None else step.prev_rows.tolist()
            got_src = [] if step.prev_src is None else step.prev_src.tolist()
            assert (got_rows, got_src) == (expected_rows, expected_src)
            assert all(row in positions for row in got_rows)
            mapped += len(got_rows)
            assert step.slot_mapping.tolist() == ref["slots"] and step.positions.tolist() == ref["positions"]
        if previous is not None:         # step N's real ids arrive after N+1 was built
            for seq in sched.resolve_placeholders(previous[0], previous[1], PLACEHOLDER_TOKEN):
                builder.release(seq.seq_id)
            previous = None
        if step is not None:
            for seq in sched.postprocess(out, [PLACEHOLDER_TOKEN] * len(out.sampling)):
                builder.release(seq.seq_id)
            previous = (out, [rng.randrange(1, 500) for _ in out.sampling])
        if rng.random() < 0.1 and sched.num_running:         # abort a running sequence now and then
            victim = next(s for s in live if not s.is_finished and s.block_table)
            sched.abort(victim.seq_id)
            builder.release(victim.seq_id)
    assert mapped > 0 and (preempted > 0 or seed == 2)
    assert all(PLACEHOLDER_TOKEN not in seq.token_ids for seq in live)


def test_block_table_cache_notices_a_replaced_table():
    cache = BlockTableCache(max_blocks_per_seq=8, initial_rows=1)
    seq = Sequence([1, 2, 3])
    seq.block_table = [5, 6]
    row = cache.row(seq)
    assert cache.table[row, :2].tolist() == [5, 6]
    seq.block_table.append(9)
    assert cache.table[cache.row(seq), :3].tolist() == [5, 6, 9]
    seq.block_table = [7, 8, 1]                            # same length, new blocks (re-admitted)
    assert cache.table[cache.row(seq), :3].tolist() == [7, 8, 1]
    other = Sequence([4])
    other.block_table = [3]
    assert cache.row(other) != cache.row(seq)              # grows past its initial single row
    cache.release(seq.seq_id)
    assert seq.seq_id not in cache.row_of


def test_staging_buffer_layout_and_padding():
    buf = StagingBuffer(torch.int64, 64, torch.device("cpu"))
    buf.begin()
    a = buf.put(np.array([1, 2, 3]), 5, fill=-1)
    b = buf.put(np.array([7]))
    buf.upload()
    assert a.tolist() == [1, 2, 3, -1, -1] and b.tolist() == [7]
    rows = StagingBuffer(torch.int32, 64, torch.device("cpu"))
    rows.begin()
    view = rows.put_rows(np.array([[1, 2], [3, 4]], dtype=np.int32), 2, 2)
    assert view.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(AssertionError):
        rows.put(np.zeros(1000))


def test_staging_views_of_a_repeated_layout_show_each_steps_values():
    """A layout staged again (every replay of one CUDA-graph size) reuses its views: each step's
    values, and the runner's writes into them, show through, in and out of inference mode."""
    buf = StagingBuffer(torch.int64, 64, torch.device("cpu"))
    seen = []
    for step, inference in enumerate([False, True, True, False]):
        with torch.inference_mode(inference):
            buf.begin()
            ids = buf.put(np.array([step, step + 1]), 4, fill=-1)
            table = buf.put_rows(np.full((2, 3), step), 2, 3)
            buf.upload()
            ids[3] = 9                                   # the runner writes into staged inputs
            seen.append((ids.tolist(), table.tolist()))
    assert [s[0] for s in seen] == [[k, k + 1, -1, 9] for k in range(4)]
    assert [s[1] for s in seen] == [[[k] * 3] * 2 for k in range(4)]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_staging_views_are_16_byte_aligned_whatever_the_sizes(dtype):
    """Triton specialises on pointer alignment: a view at a size-dependent offset would make kernels
    recompile mid-run. Capacity covers the requested elements plus the alignment padding."""
    buf = StagingBuffer(dtype, 3 + 5 + 7 + 1, torch.device("cpu"))
    buf.begin()
    views = [buf.put(np.arange(n), n) for n in (3, 5, 7, 1)]
    assert [v.tolist() for v in views] == [list(range(n)) for n in (3, 5, 7, 1)]
    assert all(v.data_ptr() % 16 == 0 for v in views)


@pytest.mark.parametrize("max_bs", [1, 5, 16, 100, 256, 512])
def test_graph_batch_sizes_cover_every_batch(max_bs):
    sizes = graph_batch_sizes(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
    graphs = DecodeGraphs(max_bs, 8, torch.float32, torch.device("cpu"))
    assert graphs.padded_size(1) is None                  # nothing captured yet: eager
    graphs.graphs = {s: None for s in sizes}
    for b in range(1, max_bs + 1):
        p = graphs.padded_size(b)
        assert p in sizes and p >= b and all(s < b for s in sizes if s < p)
    assert graphs.padded_size(max_bs + 1) is None
