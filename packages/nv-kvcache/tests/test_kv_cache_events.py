"""Prefix-cache events of the BlockManager (what KV-aware routers follow): replaying them gives exactly
the set of cached hashes; nothing is recorded unless asked."""
import random

from nv_kvcache import (
    AllBlocksCleared,
    BlockManager,
    BlockRemoved,
    BlockStored,
    Scheduler,
    Sequence,
    StopRules,
    hash_block_tokens,
)
from nv_kvcache.testing import FakeModel


def replay(cached: set[int], events: list) -> set[int]:
    for event in events:
        if isinstance(event, BlockStored):
            cached.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            cached.difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            cached.clear()
        else:
            raise AssertionError(f"unknown event {event!r}")
    return cached


def computed_seq(bm: BlockManager, tokens: list[int]) -> Sequence:
    seq = Sequence(tokens)
    assert bm.allocate(seq, len(tokens), bm.match_prefix(seq))
    seq.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(seq)
    return seq


def test_stored_event_carries_the_hash_chain_and_tokens():
    bm = BlockManager(num_blocks=10, block_size=2, enable_kv_cache_events=True)
    seq = computed_seq(bm, [1, 2, 3, 4, 5])
    [event] = bm.take_events()
    h0 = hash_block_tokens(None, [1, 2])
    h1 = hash_block_tokens(h0, [3, 4])
    assert event == BlockStored([h0, h1], None, [1, 2, 3, 4], 2, None, "GPU")
    seq.token_ids.append(6)
    seq.num_computed_tokens = 6
    bm.allocate(seq, 6)
    bm.cache_full_blocks(seq)
    [event] = bm.take_events()
    assert event == BlockStored([hash_block_tokens(h1, [5, 6])], h1, [5, 6], 2, None, "GPU")
    assert bm.take_events() == []


def test_eviction_and_reset_events():
    bm = BlockManager(num_blocks=3, block_size=2, enable_kv_cache_events=True)
    a = computed_seq(bm, [1, 2, 3, 4])          # blocks 0, 1 cached
    bm.free(a)
    b = computed_seq(bm, [9, 9, 9])             # takes free block 2, then evicts block 1 ([3, 4])
    events = bm.take_events()
    assert isinstance(events[-1], BlockStored) and events[-1].block_hashes == [hash_block_tokens(None, [9, 9])]
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved([bm_hash := hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])])]
    assert bm_hash not in bm._hash_to_block
    assert bm.reset_prefix_cache() == 1         # a's first block is free; b's stays (in use)
    assert bm.take_events() == [BlockRemoved([hash_block_tokens(None, [1, 2])])]
    bm.free(b)
    bm.reset_prefix_cache()
    assert bm.take_events() == [AllBlocksCleared()]
    assert bm.num_cached_blocks == 0


def test_disabled_records_nothing():
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.free(computed_seq(bm, [1, 2, 3, 4, 5]))
    computed_seq(bm, [7, 7, 7, 7, 7, 7])
    bm.reset_prefix_cache()
    assert bm._events is None and bm.take_events() == []


def test_replay_matches_the_cache_through_a_busy_run():
    rng = random.Random(0)
    sched = Scheduler(num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                      max_model_len=64, enable_kv_cache_events=True)
    model = FakeModel()
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 12))] for _ in range(4)]
    cached: set[int] = set()
    kinds: set[type] = set()
    for step in range(400):
        if step % 2 == 0 and len(sched._seqs) < 12:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            sched.add(Sequence(prompt, StopRules(max_tokens=rng.randrange(1, 30))))
        if step % 97 == 96:
            sched.block_manager.reset_prefix_cache()
        if sched.has_unfinished():
            out = sched.schedule()
            sched.postprocess(out, model.step(out))
        events = sched.take_kv_events()
        kinds.update(type(e) for e in events)
        assert replay(cached, events) == set(sched.block_manager._hash_to_block), step
    assert kinds >= {BlockStored, BlockRemoved}
    assert sched.stats().num_preemptions > 0 and sched.stats().prefix_cache_hits > 0
