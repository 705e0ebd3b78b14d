"""Scheduler.stats(): queue lengths, KV usage and the cumulative prefix-cache / preemption counters
that the metrics (vllm:prefix_cache_queries, vllm:prefix_cache_hits, vllm:num_preemptions) are made of."""
import pickle

from nv_kvcache import Scheduler, SchedulerStats, Sequence, StopRules
from nv_kvcache.testing import FakeModel, reference_output, run_to_completion


def make(**kw) -> Scheduler:
    args = dict(num_blocks=1000, block_size=16, max_num_seqs=64, max_num_batched_tokens=1024,
                max_model_len=4096)
    return Scheduler(**{**args, **kw})


def test_fresh_scheduler_stats_are_zero_and_picklable():
    stats = make().stats()
    assert stats == SchedulerStats(0, 0, 0.0, 0, 0, 0)
    assert pickle.loads(pickle.dumps(stats)) == stats


def test_queues_and_usage():
    sched, model = make(num_blocks=10, block_size=16, max_num_seqs=1), FakeModel()
    sched.add(Sequence(list(range(40)), StopRules(max_tokens=4)))
    sched.add(Sequence(list(range(5)), StopRules(max_tokens=4)))
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 2, 0.0)
    out = sched.schedule()
    sched.postprocess(out, model.step(out))
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert stats.kv_cache_usage == 3 / 10          # 40 tokens in blocks of 16
    run_to_completion(sched, model)
    assert sched.stats().kv_cache_usage == 0.0


def test_prefix_hits_counted_in_tokens():
    sched, model = make(block_size=16), FakeModel()
    shared = list(range(100, 140))                  # 40 tokens: two full blocks
    sched.add(Sequence(shared + [1, 2], StopRules(max_tokens=3)))
    run_to_completion(sched, model)
    after_first = sched.stats()
    assert (after_first.prefix_cache_queries, after_first.prefix_cache_hits) == (42, 0)
    sched.add(Sequence(shared + [7, 8, 9], StopRules(max_tokens=3)))
    out = sched.schedule()
    assert out.scheduled[0].num_new_tokens == 43 - 32
    stats = sched.stats()
    assert stats.prefix_cache_queries == 42 + 43
    assert stats.prefix_cache_hits == 32            # the two shared full blocks


def test_forced_preemption_is_counted():
    # 6 blocks of 4: three sequences growing to 16 tokens each cannot all stay
    sched, model = make(num_blocks=6, block_size=4, max_num_batched_tokens=64, max_model_len=64), FakeModel()
    rules = StopRules(max_tokens=10)
    seqs = [Sequence([i, i + 1, i + 2, i + 3, i + 4, i + 5], rules) for i in (0, 10, 20)]
    for seq in seqs:
        sched.add(seq)
    run_to_completion(sched, model, check=True)
    stats = sched.stats()
    assert stats.num_preemptions > 0
    assert stats.num_preemptions == sum(s.num_preemptions for s in seqs)
    for seq in seqs:       # preemption changed no output
        assert seq.output_token_ids == reference_output(seq.prompt_token_ids, model, rules)[0]
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
