"""The verify-step decode attention (Q query tokens per sequence, triton_verify) under TRITON_INTERPRET=1 on CPU
against the torch reference, and the reference against the dense causal attention (small shapes)."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels.kv_layout import to_token_major
from nv_kernels.kv_quant import quantize
from nv_kernels.testing import (
    PagedBatch,
    dense_causal_attention,
    interpreted_triton_modules,
    random_paged_batch,
    relative_error,
)
from nv_kernels.torch_backend import TorchBackend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
REF = TorchBackend()
TOL = 1e-5  # fp32 on the interpreter


@pytest.fixture(scope="module")
def verify() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.triton_verify") as (module,):
        yield module


@pytest.fixture()
def poisoned(verify: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output and workspace the kernel allocates starts as NaN."""
    def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(*args, fill_value=float("nan"), **kwargs)

    monkeypatch.setattr(verify, "_empty", nan_empty)


def _batch(seq_lens: list[int], query_len: int, heads: tuple[int, int], block_size: int, seed: int) -> PagedBatch:
    """Fresh random sequences whose last `query_len` positions are queries (each sequence has at least that many)."""
    return random_paged_batch(seq_lens, [query_len] * len(seq_lens), num_q_heads=heads[0], num_kv_heads=heads[1],
                              head_dim=16, block_size=block_size, seed=seed)


def test_reference_is_causal_attention_over_the_last_q_positions() -> None:
    b = _batch([4, 19, 40], 4, (4, 2), 8, seed=1)
    out = REF.decode_queries(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                             max_seqlen_k=64, scale=0.3, query_len=4)
    for i in range(3):
        dense = dense_causal_attention(b.q[4 * i:4 * i + 4], b.keys[i], b.values[i], 0.3)
        assert relative_error(out[4 * i:4 * i + 4], dense.float()) < TOL


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 1)])
@pytest.mark.parametrize("query_len,block_size,num_splits,tile", [(4, 4, 1, None), (2, 16, 4, None),
                                                                  (4, 32, 2, 16), (3, 1, 3, None), (1, 8, 2, None)])
def test_verify_matches_reference(verify: ModuleType, poisoned: None, heads: tuple[int, int], query_len: int,
                                  block_size: int, num_splits: int, tile: int | None) -> None:
    seq_lens = [query_len, 37, 16, 70, 5]   # queries only, partial last blocks, exact pages, a tail across tiles
    b = _batch(seq_lens, query_len, heads, block_size, seed=block_size + query_len)
    out = verify.verify_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables, max_seqlen_k=128,
                                  scale=0.25, query_len=query_len, num_splits=num_splits, tile=tile)
    ref = REF.decode_queries(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                             max_seqlen_k=128, scale=0.25, query_len=query_len)
    assert relative_error(out, ref) < TOL


def test_front_padding_rows_with_nothing_to_attend_to_are_zero(verify: ModuleType, poisoned: None) -> None:
    """A sequence shorter than Q (front-padded in a verify step): rows whose limit is <= 0 come out 0, the others
    attend to their prefix; nothing outside a context is read (NaN there)."""
    b = _batch([6, 9], 1, (4, 2), 4, seed=3)
    q = torch.randn(2 * 8, 4, 16, generator=torch.Generator().manual_seed(4))
    seq_lens = torch.tensor([2, 9], dtype=torch.int32)   # sequence 0: 2 tokens for 8 query rows
    for splits in (1, 4):
        out = verify.verify_attention(q, b.k_cache, b.v_cache, seq_lens, b.block_tables, max_seqlen_k=16,
                                      scale=0.5, query_len=8, num_splits=splits)
        ref = REF.decode_queries(q, b.k_cache, b.v_cache, seq_lens=seq_lens, block_tables=b.block_tables,
                                 max_seqlen_k=16, scale=0.5, query_len=8)
        assert not out.isnan().any()
        assert out[:6].abs().max() == 0       # limits 2 - 8 + 1 + j <= 0 for j < 6
        assert relative_error(out, ref) < TOL


def test_fp8_token_major_cache_matches_reference(verify: ModuleType, poisoned: None) -> None:
    b = _batch([5, 37, 16], 4, (4, 2), 16, seed=7)
    k_scale = (b.k_cache.nan_to_num().abs().amax() / 200).reshape(1).float()
    v_scale = torch.tensor([0.02])
    k_cache = quantize(b.k_cache, k_scale, torch.float8_e4m3fn)
    v_cache = to_token_major(quantize(b.v_cache, v_scale, torch.float8_e4m3fn))
    q = b.q.to(torch.bfloat16)
    out = verify.verify_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, max_seqlen_k=64, scale=0.25,
                                  query_len=4, num_splits=2, k_scale=k_scale, v_scale=v_scale)
    ref = REF.decode_queries(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                             max_seqlen_k=64, scale=0.25, query_len=4, k_scale=k_scale, v_scale=v_scale)
    assert relative_error(out.float(), ref.float()) < 4e-3


def test_rows_not_in_whole_sequences_are_refused(verify: ModuleType) -> None:
    b = _batch([8], 4, (2, 2), 4, seed=0)
    with pytest.raises(ValueError, match="query_len"):
        verify.verify_attention(b.q[:3], b.k_cache, b.v_cache, b.seq_lens, b.block_tables, max_seqlen_k=8,
                                scale=1.0, query_len=2)
