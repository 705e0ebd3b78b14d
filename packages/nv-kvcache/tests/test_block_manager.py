"""BlockManager: exact block ids, hash chain, ref counts, free-queue order, failed allocations.
Modelled on vLLM's tests/v1/core/test_prefix_caching.py."""
from array import array

import pytest
import xxhash

import nv_kvcache.block_manager as block_manager_module
from nv_kvcache import BlockManager, Sequence, hash_block_tokens


def computed_seq(bm: BlockManager, tokens: list[int], cached: bool = True) -> Sequence:
    """Admit `tokens` as if its whole prompt was computed; registers its full blocks."""
    seq = Sequence(tokens)
    hits = bm.match_prefix(seq) if cached else []
    assert bm.allocate(seq, len(tokens), hits)
    seq.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(seq)
    return seq


def snapshot(bm: BlockManager) -> tuple:
    return (bm.free_block_ids(), [bm.ref_count(b) for b in range(bm.num_blocks)],
            [bm.block_hash(b) for b in range(bm.num_blocks)], bm.num_cached_blocks, bm.num_free_blocks,
            bm.num_query_tokens, bm.num_hit_tokens, dict(bm._hash_to_block))


def test_exact_block_ids_in_allocation_order():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = Sequence(list(range(10)))
    assert bm.allocate(a, 10)
    assert a.block_table == [0, 1, 2]
    b = Sequence(list(range(100, 105)))
    assert bm.allocate(b, 5)
    assert b.block_table == [3, 4]
    assert bm.allocate(b, 9)            # grows by one block
    assert b.block_table == [3, 4, 5]
    assert bm.allocate(b, 9)            # already large enough: nothing taken
    assert b.block_table == [3, 4, 5]
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 6
    assert bm.usage == pytest.approx(0.6)


def test_hash_chain_is_xxh64_over_parent_hash_and_token_ids():
    bm = BlockManager(num_blocks=8, block_size=3)
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]        # 2 full blocks + a partial one
    seq = computed_seq(bm, tokens)
    h0 = xxhash.xxh64_intdigest(array("q", [5, 6, 7]).tobytes())
    h1 = xxhash.xxh64_intdigest(h0.to_bytes(8, "little") + array("q", [8, 9, 10]).tobytes())
    assert bm.block_hash(seq.block_table[0]) == h0 == hash_block_tokens(None, [5, 6, 7])
    assert bm.block_hash(seq.block_table[1]) == h1 == hash_block_tokens(h0, [8, 9, 10])
    assert bm.block_hash(seq.block_table[2]) is None          # the partial block is never shared
    assert bm.num_cached_blocks == 2
    # Same block content after a different prefix hashes differently.
    assert hash_block_tokens(hash_block_tokens(None, [1, 2, 3]), [8, 9, 10]) != h1


def test_prefix_hit_shares_blocks_by_ref_count():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = computed_seq(bm, list(range(10)))                    # blocks 0, 1 full, 2 partial
    b = Sequence(list(range(8)) + [99, 98, 97])
    hits = bm.match_prefix(b)
    assert hits == [0, 1]
    assert bm.allocate(b, b.num_tokens, hits)
    assert b.block_table == [0, 1, 3]
    assert [bm.ref_count(i) for i in range(4)] == [2, 2, 1, 1]
    assert bm.num_hit_tokens == 8 and bm.num_query_tokens == 10 + 11
    assert bm.hit_rate == pytest.approx(8 / 21)
    bm.free(a)
    assert [bm.ref_count(i) for i in range(4)] == [1, 1, 0, 1]
    assert bm.free_block_ids()[-1] == 2
    bm.free(b)
    assert bm.num_free_blocks == 10


def test_hits_never_cover_the_whole_prompt():
    bm = BlockManager(num_blocks=10, block_size=4)
    computed_seq(bm, list(range(12)))                        # 3 full blocks
    assert bm.match_prefix(Sequence(list(range(12)))) == [0, 1]   # (12 - 1) // 4 = 2 blocks
    assert bm.match_prefix(Sequence(list(range(13)))) == [0, 1, 2]
    assert bm.match_prefix(Sequence(list(range(4)))) == []


def test_hit_checks_token_ids_against_hash_collisions(monkeypatch):
    monkeypatch.setattr(block_manager_module, "hash_block_tokens", lambda parent, tokens: 42)
    bm = BlockManager(num_blocks=10, block_size=2)
    computed_seq(bm, [1, 2, 3])
    assert bm.match_prefix(Sequence([7, 8, 9])) == []        # same (forced) hash, other tokens
    assert bm.match_prefix(Sequence([1, 2, 9])) == [0]


def test_freed_blocks_are_reused_least_recently_freed_first_tail_first():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = computed_seq(bm, list(range(12)))                    # [0, 1, 2]
    b = computed_seq(bm, list(range(50, 62)))                # [3, 4, 5]
    bm.free(a)
    bm.free(b)
    assert bm.free_block_ids() == [6, 7, 8, 9, 2, 1, 0, 5, 4, 3]
    c = Sequence(list(range(200, 240)))                      # 10 blocks, no hits
    assert bm.allocate(c, 40, bm.match_prefix(c))
    assert c.block_table == [6, 7, 8, 9, 2, 1, 0, 5, 4, 3]
    assert bm.num_cached_blocks == 0                         # reuse evicted every old hash


def test_freed_block_keeps_its_hash_until_reused():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = computed_seq(bm, list(range(9)))                     # [0, 1, 2]; 0, 1 hashed
    bm.free(a)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 6
    b = Sequence(list(range(9)))
    hits = bm.match_prefix(b)
    assert hits == [0, 1]
    assert bm.allocate(b, 9, hits)
    assert b.block_table == [0, 1, 3]                        # hits leave the queue, 3 is its head
    assert bm.free_block_ids() == [4, 5, 2]
    bm.free(b)
    # Reusing block 1 (freed before block 0) evicts its hash: later hits stop before it.
    filler = Sequence(list(range(300, 316)))
    assert bm.allocate(filler, 16)
    assert filler.block_table == [4, 5, 2, 3]
    assert bm.allocate(filler, 20)
    assert filler.block_table[-1] == 1
    assert bm.match_prefix(Sequence(list(range(9)))) == [0]
    assert bm.num_cached_blocks == 1


def test_failed_allocation_leaves_every_count_unchanged():
    bm = BlockManager(num_blocks=5, block_size=4)
    a = computed_seq(bm, list(range(9)))                     # uses 0, 1, 2
    bm.free(a)
    holder = Sequence(list(range(100, 108)))
    assert bm.allocate(holder, 8)                            # takes 3, 4
    before = snapshot(bm)
    big = Sequence(list(range(500, 524)))
    assert not bm.allocate(big, 24)                          # needs 6 > 3 free
    assert snapshot(bm) == before and big.block_table == []
    # Hits on free cached blocks count as taken from the queue: 2 revived + 2 new > 3 free.
    c = Sequence(list(range(8)) + [7] * 8)
    hits = bm.match_prefix(c)
    assert hits == [0, 1]
    assert not bm.allocate(c, 16, hits)
    assert snapshot(bm) == before and c.block_table == [] and c._num_hashed_blocks == 0
    assert bm.allocate(c, 12, hits)                          # 2 revived + 1 new fit


def test_cache_off_means_no_sharing():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    a = computed_seq(bm, list(range(10)), cached=False)
    assert bm.num_cached_blocks == 0
    b = Sequence(list(range(10)))
    assert bm.match_prefix(b) == []
    assert bm.allocate(b, 10)
    assert set(a.block_table).isdisjoint(b.block_table)
    assert all(bm.ref_count(i) <= 1 for i in range(10))
    assert bm.hit_rate == 0.0


def test_duplicate_content_registers_once():
    bm = BlockManager(num_blocks=10, block_size=2)
    a, b = Sequence([1, 2, 3]), Sequence([1, 2, 3])
    for seq in (a, b):                     # both admitted before either is computed: no hits
        assert bm.allocate(seq, 3)
    for seq in (a, b):
        seq.num_computed_tokens = 3
        bm.cache_full_blocks(seq)
    assert bm.num_cached_blocks == 1
    assert bm.block_hash(a.block_table[0]) is not None and bm.block_hash(b.block_table[0]) is None
    registered = a.block_table[0]
    bm.free(a)
    bm.free(b)
    assert bm.match_prefix(Sequence([1, 2, 3])) == [registered]


def test_hash_registered_only_when_block_full_and_computed():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = Sequence(list(range(10)))
    assert bm.allocate(seq, 6)             # first chunk: 6 tokens
    seq.num_computed_tokens = 6
    bm.cache_full_blocks(seq)
    assert bm.num_cached_blocks == 1       # block 1 is half computed
    assert bm.allocate(seq, 10)
    seq.num_computed_tokens = 10
    bm.cache_full_blocks(seq)
    assert bm.num_cached_blocks == 2       # block 2 holds 2 of 4 tokens


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_any_block_size(block_size):
    bm = BlockManager(num_blocks=64, block_size=block_size)
    a = computed_seq(bm, list(range(20)))
    b = Sequence(list(range(20)))
    hits = bm.match_prefix(b)
    assert len(hits) == 19 // block_size
    assert hits == a.block_table[:len(hits)]


def test_reset_prefix_cache_drops_only_free_blocks():
    bm = BlockManager(num_blocks=10, block_size=2)
    a = computed_seq(bm, [1, 2, 3, 4, 5])
    b = computed_seq(bm, [9, 8, 7])
    bm.free(a)
    assert bm.reset_prefix_cache() == 2
    assert bm.num_cached_blocks == 1 and bm.block_hash(b.block_table[0]) is not None


@pytest.mark.parametrize("kwargs", [dict(num_blocks=0, block_size=4), dict(num_blocks=4, block_size=0)])
def test_bad_sizes_raise(kwargs):
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockManager(**kwargs)
    with pytest.raises(TypeError):
        BlockManager(num_blocks=4.0, block_size=4)
