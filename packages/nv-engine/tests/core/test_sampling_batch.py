"""SamplingBatchBuilder / SamplingTensorsSource / unpack_results on CPU."""
from __future__ import annotations

import pickle
import random
import time

import numpy as np
import pytest
import torch

from nv_engine.core.sampling_batch import SamplingBatchBuilder, SamplingRow, sequence_seed, unpack_results
from nv_engine.core.step import StepResult
from nv_engine.engine.outputs import Logprob
from nv_engine.runner.sampling_tensors import SamplingTensorsSource
from nv_engine.sampling_params import SamplingParams
from nv_layers.sampler import Sampler, fast_path_applies

VOCAB = 64
EOS = 63


def sample(rows, logits, builder=None):
    builder = builder or SamplingBatchBuilder(VOCAB, [EOS])
    batch = builder.build(rows)
    tensors = SamplingTensorsSource("cpu").get(batch)
    return batch, tensors, Sampler()(logits, tensors)


def test_flags_and_greedy_rows_have_filters_off():
    rows = [SamplingRow(SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2), 1, 0),
            SamplingRow(SamplingParams(temperature=1e-6), 2, 0),
            SamplingRow(SamplingParams(top_k=100, logprobs=2), 3, 0)]  # top_k >= V is off
    batch = SamplingBatchBuilder(VOCAB, [EOS]).build(rows)
    assert batch.arrays["temperatures"].tolist() == [0.0, 0.0, 1.0]
    assert batch.arrays["top_k"].tolist() == [0, 0, 0]
    assert batch.flags == dict(num_logprobs=2, need_logprobs=True, all_greedy=False,
                               any_greedy=True, any_top_k=False, any_top_p=False,
                               any_min_p=False, max_top_k=None)
    assert "presence_penalties" not in batch.arrays and batch.banned_token_ids is None
    greedy = [SamplingRow(SamplingParams(temperature=0.0), 1, 0)] * 2
    assert SamplingBatchBuilder(VOCAB).build(greedy).flags["all_greedy"]
    mixed = [SamplingRow(SamplingParams(top_k=5), 1, 0), SamplingRow(SamplingParams(top_k=9), 1, 0)]
    flags = SamplingBatchBuilder(VOCAB).build(mixed).flags
    assert flags["any_top_k"] and flags["max_top_k"] == 9 and flags["need_logprobs"] is False


@pytest.mark.parametrize("extra", [
    {}, {"temperature": 0.0}, {"temperature": 0.0, "top_p": 0.5, "top_k": 3}, {"top_k": 5}, {"top_p": 0.9},
    {"min_p": 0.1}, {"logprobs": 0}, {"logprobs": 3}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.2},
    {"repetition_penalty": 1.2}, {"logit_bias": {4: 2.0}}, {"allowed_token_ids": [1, 2]},
    {"min_tokens": 3}])
def test_temperature_only_is_the_samplers_fast_path(extra):
    """SamplingBatch.temperature_only (decided on the host, where the runner picks the LM head's CUDA graph)
    holds exactly when the sampler's fast path applies to the batch's tensors, a grammar's bitmask aside."""
    rows = [SamplingRow(SamplingParams(**{"temperature": 0.8, **extra}), 1, 0, [1, 2], [3]),
            SamplingRow(SamplingParams(temperature=0.0), 2, 0, [1], [5])]
    batch = SamplingBatchBuilder(VOCAB, [EOS]).build(rows)
    assert batch.temperature_only == fast_path_applies(SamplingTensorsSource("cpu").get(batch))
    assert batch.temperature_only == (not extra or extra.get("temperature") == 0.0)
    batch.token_bitmask = np.full((2, 2), -1, dtype=np.int32)
    assert not batch.temperature_only


def test_static_part_is_cached_while_params_are_the_same_objects():
    builder = SamplingBatchBuilder(VOCAB, [EOS])
    cache = SamplingTensorsSource("cpu")
    params = SamplingParams(temperature=0.7)
    first = builder.build([SamplingRow(params, 5, 0), SamplingRow(params, 6, 0)])
    second = builder.build([SamplingRow(params, 5, 1), SamplingRow(params, 7, 1)])
    assert second.static_id == first.static_id and second.arrays is first.arrays
    t1, t2 = cache.get(first), cache.get(second)
    assert t2.temperatures is t1.temperatures  # device tensors reused
    assert t2.seeds.tolist() == [5, 7] and t2.positions.tolist() == [1, 1]
    third = builder.build([SamplingRow(SamplingParams(temperature=0.7), 5, 2)] * 2)
    assert third.static_id != first.static_id  # other objects: rebuilt
    assert pickle.loads(pickle.dumps(third)).seeds_positions.tolist() == [[5, 5], [2, 2]]


def test_rebuilt_rows_follow_each_params_object_through_joins_leaves_and_reorders():
    """When the rows change, each row's values come from its own SamplingParams (kept per object while
    it is a row; a new object with a reused id is read afresh)."""
    builder = SamplingBatchBuilder(VOCAB, [EOS])
    a, b = SamplingParams(temperature=0.5, top_k=4), SamplingParams(temperature=0.9, presence_penalty=0.5)
    first = builder.build([SamplingRow(a, 1, 0), SamplingRow(b, 2, 0)])
    assert first.arrays["temperatures"].tolist() == pytest.approx([0.5, 0.9])
    assert first.arrays["presence_penalties"].tolist() == [0.0, 0.5]
    for _ in range(50):   # objects dropped and created: ids may be reused, values must not leak
        c = SamplingParams(temperature=0.25, logprobs=3)
        batch = builder.build([SamplingRow(c, 3, 0), SamplingRow(a, 1, 1)])
        assert batch.arrays["temperatures"].tolist() == pytest.approx([0.25, 0.5])
        assert batch.arrays["top_k"].tolist() == [0, 4] and "presence_penalties" not in batch.arrays
        assert batch.flags["num_logprobs"] == 3 and batch.logprob_counts == [3, None]
        del c
    greedy = builder.build([SamplingRow(SamplingParams(temperature=0.0, min_tokens=2), 4, 0), SamplingRow(b, 2, 1)])
    assert greedy.flags["any_greedy"] and not greedy.flags["all_greedy"]
    assert greedy.banned_token_ids is not None and greedy.banned_token_ids[0].tolist()[:1] == [EOS]


def test_build_is_fast_for_identical_params():
    builder = SamplingBatchBuilder(151936, [EOS])
    cache = SamplingTensorsSource("cpu")
    params = SamplingParams(temperature=0.8, top_p=0.95)
    rows = [SamplingRow(params, i, 10) for i in range(256)]
    cache.get(builder.build(rows))
    start = time.perf_counter()
    for _ in range(200):
        cache.get(builder.build(rows))
    per_step = (time.perf_counter() - start) / 200
    assert per_step < 1e-3, per_step  # ~25 us on a laptop core; loose for slow CI machines


def test_seeded_rows_are_batch_independent_through_the_builder():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=gen)
    p = SamplingParams(temperature=1.0, seed=123)
    _, _, alone = sample([SamplingRow(p, 123, 4)], logits[1:2])
    other = SamplingParams(temperature=0.5, top_k=3)
    _, _, mixed = sample([SamplingRow(other, 9, 0), SamplingRow(p, 123, 4),
                          SamplingRow(SamplingParams(temperature=0), 1, 0)], logits)
    assert int(mixed.token_ids[1]) == int(alone.token_ids[0])
    assert int(mixed.token_ids[2]) == int(logits[2].argmax())


def test_penalties_reach_the_sampler():
    logits = torch.zeros(2, VOCAB)
    logits[:, 10] = 2.0
    logits[:, 11] = 1.9
    logits[:, 12] = 1.0
    rep = SamplingParams(temperature=0.0, repetition_penalty=1.2)
    freq = SamplingParams(temperature=0.0, frequency_penalty=0.5)
    rows = [SamplingRow(rep, 0, 1, [10], [3]), SamplingRow(freq, 0, 2, [11], [10, 10])]
    batch, tensors, out = sample(rows, logits)
    assert batch.prompt_token_ids[0].tolist() == [10] and batch.prompt_token_ids[1].tolist() == [VOCAB]
    assert out.token_ids.tolist() == [11, 11]  # 2.0 / 1.2 < 1.9 ; 2.0 - 1.0 < 1.9
    with pytest.raises(ValueError, match="token ids"):
        SamplingBatchBuilder(VOCAB).build([(rep, 0, 1)])


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.zeros(3, VOCAB)
    logits[:, EOS] = 9.0
    logits[:, 5] = 8.0
    logits[:, 6] = 7.0
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[5, 1000])
    no_eos = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[5], ignore_eos=True)
    rows = [SamplingRow(p, 0, 0), SamplingRow(p, 0, 2), SamplingRow(no_eos, 0, 1)]
    batch, _, out = sample(rows, logits)
    assert out.token_ids.tolist() == [6, EOS, EOS]  # row 2 ignores EOS: only id 5 is banned
    assert batch.banned_token_ids[1].tolist() == [VOCAB, VOCAB]


def test_unpack_results_builds_logprob_dicts():
    logits = torch.linspace(3.0, 0.0, VOCAB).expand(3, -1)  # token i has rank i + 1
    rows = [SamplingRow(SamplingParams(temperature=0.0, logprobs=2), 0, 0),
            SamplingRow(SamplingParams(temperature=0.0), 0, 0),
            SamplingRow(SamplingParams(temperature=0.0, logprobs=0), 0, 0)]
    batch, _, out = sample(rows, logits.contiguous())
    results = unpack_results(_host_result(out), batch.logprob_counts)
    assert [r.token_id for r in results] == [0, 0, 0]
    assert results[1].logprobs is None and results[1].logprob is None
    assert list(results[2].logprobs) == [0] and results[2].logprobs[0].rank == 1
    top = results[0].logprobs
    assert list(top) == [0, 1] and top[1].rank == 2  # chosen first, then the top 2
    lp = torch.log_softmax(logits[0], dim=-1)
    assert top[0] == Logprob(pytest.approx(float(lp[0])), 1)
    assert top[1].logprob == pytest.approx(float(lp[1]))
    # A sampled token outside the top k still appears, with its own rank.
    moved_result = _host_result(out)
    moved_result.token_ids[0], moved_result.logprobs[0], moved_result.ranks[0] = 9, float(lp[9]), 10
    moved = unpack_results(moved_result, batch.logprob_counts)[0].logprobs
    assert list(moved) == [9, 0, 1] and moved[9].rank == 10
    with pytest.raises(ValueError, match="rows"):
        unpack_results(_host_result(out), [None])


def _host_result(out) -> StepResult:
    """The sampler's tensors as the StepResult the runner sends back."""
    def host(t):
        return None if t is None else t.tolist()
    return StepResult(token_ids=host(out.token_ids), logprobs=host(out.logprobs), ranks=host(out.ranks),
                      topk_ids=host(out.topk_ids), topk_logprobs=host(out.topk_logprobs))


def test_sequence_seed():
    rng = random.Random(0)
    assert sequence_seed(10, 2, rng) == 12
    assert sequence_seed(2**63 - 1, 1, rng) == -(2**63)  # wraps into int64
    a, b = sequence_seed(None, 0, rng), sequence_seed(None, 0, rng)
    assert a != b and 0 <= a < 2**63
