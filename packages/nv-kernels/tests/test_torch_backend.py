"""The torch reference backend against a naive dense causal attention."""
from __future__ import annotations

import pytest
import torch

from nv_kernels import get_backend
from nv_kernels.testing import dense_causal_attention, random_paged_batch, relative_error

SHAPES = [(4, 4), (4, 2), (8, 2)]  # (Hq, Hkv)


@pytest.mark.parametrize("heads", SHAPES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefill_matches_dense(heads: tuple[int, int], block_size: int) -> None:
    hq, hkv = heads
    seq_lens, q_lens = [1, 7, 23, 16, 5], [1, 7, 4, 1, 5]  # fresh prompts, cached prefixes, a decode row
    batch = random_paged_batch(seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=8,
                               block_size=block_size, seed=block_size)
    out = get_backend("torch", "cpu").prefill(
        batch.q, batch.k_cache, batch.v_cache, cu_seqlens_q=batch.cu_seqlens_q, seq_lens=batch.seq_lens,
        block_tables=batch.block_tables, max_seqlen_q=batch.max_seqlen_q,
        max_seqlen_k=batch.max_seqlen_k, scale=0.3)
    cu = batch.cu_seqlens_q.tolist()
    for b in range(len(seq_lens)):
        ref = dense_causal_attention(batch.q[cu[b]:cu[b + 1]], batch.keys[b], batch.values[b], 0.3)
        assert relative_error(out[cu[b]:cu[b + 1]], ref) < 1e-6


@pytest.mark.parametrize("heads", SHAPES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_matches_dense(heads: tuple[int, int], block_size: int) -> None:
    hq, hkv = heads
    seq_lens = [1, 9, 33, 16]
    batch = random_paged_batch(seq_lens, [1] * 4, num_q_heads=hq, num_kv_heads=hkv, head_dim=8,
                               block_size=block_size, seed=3)
    out = get_backend("torch", "cpu").decode(
        batch.q, batch.k_cache, batch.v_cache, seq_lens=batch.seq_lens, block_tables=batch.block_tables,
        max_seqlen_k=64, scale=0.5)
    for b in range(len(seq_lens)):
        ref = dense_causal_attention(batch.q[b:b + 1], batch.keys[b], batch.values[b], 0.5)
        assert relative_error(out[b:b + 1], ref) < 1e-6


def test_decode_zero_length_row_is_finite() -> None:
    batch = random_paged_batch([5, 3], [1, 1], num_q_heads=2, num_kv_heads=1, head_dim=4, block_size=4)
    seq_lens = torch.tensor([5, 0], dtype=torch.int32)
    out = get_backend("torch", "cpu").decode(batch.q, batch.k_cache, batch.v_cache, seq_lens=seq_lens,
                                             block_tables=batch.block_tables, max_seqlen_k=8, scale=1.0)
    assert torch.isfinite(out).all()


def test_store_kvcache_scatters_and_skips_negative_slots() -> None:
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    key, value = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    slots = torch.tensor([5, -1, 11, 0], dtype=torch.int32)
    get_backend("torch", "cpu").store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[1, 1], key[0]) and torch.equal(v_cache[2, 3], value[2])
    assert torch.equal(k_cache[0, 0], key[3])
    assert int((k_cache.abs().sum(-1).sum(-1) > 0).sum()) == 3  # the -1 token wrote nothing


def test_shape_errors() -> None:
    backend = get_backend("torch", "cpu")
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        backend.decode(torch.zeros(1, 3, 8), cache, cache, seq_lens=torch.ones(1, dtype=torch.int32),
                       block_tables=torch.zeros(1, 1, dtype=torch.int32), max_seqlen_k=4, scale=1.0)
    with pytest.raises(ValueError, match="key must be"):
        backend.store_kvcache(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8), cache, cache,
                              torch.zeros(2, dtype=torch.int64))
