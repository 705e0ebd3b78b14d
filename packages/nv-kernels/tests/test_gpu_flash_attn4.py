"""The FlashAttention-4 backend on the GPU at real shapes against the torch reference (pytest -m gpu).

Skipped unless `flash_attn.cute` imports and the GPU is a Hopper or Blackwell. Every slot no sequence
owns holds NaN, except the tail of each sequence's last block: FA4's TMA path (block_size == its key
tile) loads those rows, masked but multiplied by P = 0, so they must be finite, as they are in nv's
engine (the cache starts zeroed and only ever holds stored K/V).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from nv_kernels.testing import PagedBatch, random_paged_batch, relative_error
from nv_kernels.torch_backend import TorchBackend


def _fa4_runs() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10, 11):
        return False
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _fa4_runs(), reason="needs flash_attn.cute on a Hopper/Blackwell GPU")]
REF = TorchBackend()
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 3e-3}
NUM_BLOCKS = 20000  # block_id * BS * Hkv * D passes 2**31 at BS >= 128 (Hkv 8, D 128)
CONTEXTS = [1, 2, 15, 16, 17, 100, 127, 128, 129, 255, 256, 257, 1000, 2048, 3001, 4096]
# (Hq, Hkv, head_dim, block_size, dtype): the Qwen3-0.6B shape at several block sizes (128: FA4's TMA
# path at head_dim 128, the others: cp.async gathers), plus other GQA groups and head dims.
CASES = [(16, 8, 128, bs, dt) for bs in (16, 64, 128, 256) for dt in (torch.bfloat16, torch.float16)]
CASES += [(32, 4, 128, 64, torch.bfloat16), (8, 8, 64, 64, torch.float16), (32, 4, 64, 128, torch.bfloat16),
          (16, 2, 128, 128, torch.float16)]


def _backend():
    from nv_kernels import get_backend
    from nv_kernels.flash_attn4_backend import FlashAttn4Backend

    backend = get_backend("flash_attn", "cuda")
    assert isinstance(backend, FlashAttn4Backend)
    return backend


def _batch(q_lens: list[int], case: tuple, seed: int, contexts: list[int] = CONTEXTS) -> PagedBatch:
    hq, hkv, d, bs, dtype = case
    b = random_paged_batch(contexts, q_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
                           num_blocks=NUM_BLOCKS, dtype=dtype, device="cuda", seed=seed)
    for row, length in enumerate(contexts):  # finite tails of the last blocks (see the module doc)
        if length % bs:
            last = int(b.block_tables[row, (length - 1) // bs])
            for cache in (b.k_cache, b.v_cache):
                cache[last, length % bs:] = torch.randn_like(cache[last, length % bs:])
    return b


@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode(case: tuple) -> None:
    backend = _backend()
    b = _batch([1] * len(CONTEXTS), case, seed=case[3])
    kw = dict(seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4096, scale=case[2] ** -0.5)
    out = backend.decode(b.q, b.k_cache, b.v_cache, **kw)
    ref = REF.decode(b.q, b.k_cache, b.v_cache, **kw)
    assert out.shape == b.q.shape and out.dtype == b.q.dtype
    assert relative_error(out, ref) < TOL[case[4]]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_prefill_with_cached_prefixes_and_store(case: tuple) -> None:
    backend = _backend()
    # fresh prompts (q_len == context), cached prefixes (q_len < context), one-token rows (decodes in a mixed step)
    q_lens = [1, 2, 15, 1, 17, 100, 27, 128, 1, 200, 256, 64, 1000, 2048, 1, 512]
    b = _batch(q_lens, case, seed=case[3] + 1)
    hq, hkv, d = case[:3]
    new_k = torch.randn(len(b.slot_mapping), hkv, d, device="cuda", dtype=case[4])
    new_v = torch.randn_like(new_k)
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    REF.store_kvcache(new_k, new_v, k_ref, v_ref, b.slot_mapping)
    backend.store_kvcache(new_k, new_v, b.k_cache, b.v_cache, b.slot_mapping)
    torch.testing.assert_close(b.k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(b.v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    del k_ref, v_ref
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=d ** -0.5)
    out = backend.prefill(b.q, b.k_cache, b.v_cache, **kw)
    assert out.shape == b.q.shape and out.dtype == b.q.dtype
    assert relative_error(out, REF.prefill(b.q, b.k_cache, b.v_cache, **kw)) < TOL[case[4]]


def test_prefill_of_more_than_256_sequences() -> None:
    """FA4 switches its varlen tile scheduler to a cumulative-block lookup above 256 sequences."""
    backend = _backend()
    case = (16, 8, 128, 64, torch.bfloat16)
    contexts = [1 + (7 * i) % 300 for i in range(300)]
    q_lens = [min(c, 1 + i % 5) for i, c in enumerate(contexts)]
    b = _batch(q_lens, case, seed=11, contexts=contexts)
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=0.1)
    out = backend.prefill(b.q, b.k_cache, b.v_cache, **kw)
    assert relative_error(out, REF.prefill(b.q, b.k_cache, b.v_cache, **kw)) < TOL[case[4]]


@pytest.mark.parametrize("block_size", [64, 128])
def test_decode_in_cuda_graph_with_zero_length_rows(block_size: int) -> None:
    """Captured once with a static max context, replayed with new lengths (incl. 0, graph padding)."""
    backend = _backend()
    case = (16, 8, 128, block_size, torch.bfloat16)
    b = _batch([1] * len(CONTEXTS), case, seed=7)
    seq_lens = b.seq_lens.clone()

    def step() -> torch.Tensor:
        return backend.decode(b.q, b.k_cache, b.v_cache, seq_lens=seq_lens, block_tables=b.block_tables,
                              max_seqlen_k=4096, scale=0.1)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    new_lens = b.seq_lens.clone()
    new_lens[::3] = 0
    new_lens[1::3] = (new_lens[1::3] // 2).clamp_min(1)
    seq_lens.copy_(new_lens)
    graph.replay()
    ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=new_lens, block_tables=b.block_tables,
                     max_seqlen_k=4096, scale=0.1)
    live = new_lens > 0
    assert relative_error(out[live], ref[live]) < TOL[case[4]]


def test_warm_up_compiles_before_the_first_call() -> None:
    import time

    backend = _backend()
    case = (16, 8, 128, 32, torch.bfloat16)  # a block size no other test here uses: its own compile key
    b = _batch([3] * len(CONTEXTS[2:]), case, seed=5, contexts=CONTEXTS[2:])
    start = time.perf_counter()
    backend.warm_up(16, b.k_cache, b.v_cache)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - start
    start = time.perf_counter()
    backend.prefill(b.q, b.k_cache, b.v_cache, cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens,
                    block_tables=b.block_tables, max_seqlen_q=3, max_seqlen_k=4096, scale=0.1)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    assert first_s < 0.5, (warm_s, first_s)  # no compile left for the first request
