"""The verify-step decode attention (triton_verify) on the GPU at real shapes against the torch reference, with
poisoned outputs and workspaces, and inside a CUDA graph replayed with new lengths."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from nv_kernels.testing import PagedBatch, random_paged_batch, relative_error
from nv_kernels.torch_backend import TorchBackend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REF = TorchBackend()
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 3e-3}
NUM_BLOCKS = 32768  # block_id * BS * Hkv * D passes 2**31 at BS >= 256 (Hkv 8, D 128)
CONTEXTS = [5, 15, 16, 17, 100, 255, 256, 257, 1000, 2048, 4096]
# (Hq, Hkv, head_dim, block_size, dtype, query_len): the Qwen3-0.6B shape (k = 3 and 5), and wider groups
CASES = [(16, 8, 128, bs, torch.bfloat16, 4) for bs in (16, 64, 256)]
CASES += [(16, 8, 128, 64, torch.float16, 6), (32, 4, 128, 32, torch.bfloat16, 4), (32, 4, 64, 16, torch.float16, 2)]


def _poison(monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.triton_verify as verify

    def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(*args, fill_value=float("nan"), **kwargs)

    monkeypatch.setattr(verify, "_empty", nan_empty)


def _batch(case: tuple, seed: int) -> PagedBatch:
    hq, hkv, d, bs, dtype, query_len = case
    # a verified sequence holds its last token and its drafts: never fewer tokens than query rows
    contexts = [max(context, query_len) for context in CONTEXTS]
    return random_paged_batch(contexts, [query_len] * len(contexts), num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                              block_size=bs, num_blocks=NUM_BLOCKS, dtype=dtype, device="cuda", seed=seed)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_verify_attention(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels import get_backend

    _poison(monkeypatch)
    b = _batch(case, seed=case[3] + case[5])
    kw = dict(seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4096, scale=case[2] ** -0.5,
              query_len=case[5])
    ref = REF.decode_queries(b.q, b.k_cache, b.v_cache, **kw)
    backend = get_backend("triton", "cuda")
    out = backend.decode_queries(b.q, b.k_cache, b.v_cache, **kw)      # the default splits (several here)
    assert relative_error(out, ref) < TOL[case[4]]
    from nv_kernels.triton_verify import verify_attention

    out = verify_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables, 4096, case[2] ** -0.5, case[5],
                           num_splits=1)
    assert relative_error(out, ref) < TOL[case[4]]


def test_verify_in_cuda_graph_with_new_lengths() -> None:
    """Captured once with a static max context, replayed with shorter lengths (front-padded rows included)."""
    from nv_kernels import get_backend

    case = (16, 8, 128, 64, torch.bfloat16, 4)
    b = _batch(case, seed=3)
    backend = get_backend("triton", "cuda")
    seq_lens = b.seq_lens.clone()

    def step() -> torch.Tensor:
        return backend.decode_queries(b.q, b.k_cache, b.v_cache, seq_lens=seq_lens, block_tables=b.block_tables,
                                      max_seqlen_k=4096, scale=0.1, query_len=4)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    new_lens = (b.seq_lens // 2).clamp_min(2)
    seq_lens.copy_(new_lens)
    graph.replay()
    ref = REF.decode_queries(b.q, b.k_cache, b.v_cache, seq_lens=new_lens, block_tables=b.block_tables,
                             max_seqlen_k=4096, scale=0.1, query_len=4)
    assert relative_error(out, ref) < TOL[case[4]]
