"""The decoder layer in one persistent kernel (nv_kernels.decode_layer) on the GPU at real shapes, with the real
grid (one program per SM, grid barriers), against the torch references of the separate ops (pytest -m gpu)."""
from __future__ import annotations

import pytest
import torch

from nv_kernels.kv_layout import to_token_major
from nv_kernels.kv_quant import dequantize, quantize
from nv_kernels.testing import decoder_layer_reference, random_paged_batch, relative_error, rotary_cos_sin

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# (hidden, q heads, KV heads, head_dim, intermediate): Qwen3-0.6B and Qwen3-8B
SHAPES = {"0.6b": (1024, 16, 8, 128, 3072), "8b": (4096, 32, 8, 128, 12288)}
EPS = 1e-6


def _layer(shape: str, seed: int):
    from nv_kernels.decode_layer import DecodeLayer

    hidden, hq, hkv, d, inter = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*size: int, scale: float) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    w = dict(input_norm=rand(hidden, scale=0.2) + 1, post_norm=rand(hidden, scale=0.2) + 1,
             qkv=rand((hq + 2 * hkv) * d, hidden, scale=hidden ** -0.5), o=rand(hidden, hq * d, scale=(hq * d) ** -0.5),
             gate_up=rand(2 * inter, hidden, scale=hidden ** -0.5), down=rand(hidden, inter, scale=inter ** -0.5),
             q_norm=rand(d, scale=0.2) + 1, k_norm=rand(d, scale=0.2) + 1,
             cos_sin_cache=rotary_cos_sin(8192, d, base=1e6, device="cuda"))
    layer = DecodeLayer(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, eps=EPS, qk_eps=EPS, **w)
    layer.check()
    return layer, w


@pytest.mark.parametrize("shape,rows,block_size", [
    ("0.6b", 1, 16), ("0.6b", 1, 64), ("0.6b", 4, 16), ("0.6b", 16, 64), ("8b", 1, 16),
    ("8b", 16, 16)])   # its K steps unroll in parts that fit shared memory (decode_layer.DOT_STAGED_BYTES)
def test_layer_matches_the_separate_ops(shape: str, rows: int, block_size: int) -> None:
    hidden, hq, hkv, d, _ = SHAPES[shape]
    contexts = [1, 17, 300, 1024, 4000, 63, 64, 65, 2, 700, 1500, 129, 3, 999, 4096, 12][:rows]
    batch = random_paged_batch(contexts, [1] * rows, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                               block_size=block_size, num_blocks=4096, dtype=torch.bfloat16, device="cuda", seed=rows)
    layer, w = _layer(shape, seed=rows)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(rows, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    residual = torch.randn(rows, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ref_k, ref_v = batch.k_cache.clone(), batch.v_cache.clone()
    ref_out, ref_r2 = decoder_layer_reference(w, x, residual, batch.seq_lens, batch.block_tables, batch.slot_mapping,
                                              ref_k, ref_v, num_q_heads=hq, num_kv_heads=hkv, eps=EPS)
    for attempt in range(3):   # repeated launches: the barrier and arrival counters reset themselves
        k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
        out, r2 = layer(x, residual, k_cache=k_cache, v_cache=v_cache, seq_lens=batch.seq_lens,
                        block_tables=batch.block_tables, positions=(batch.seq_lens - 1).long(),
                        slot_mapping=batch.slot_mapping, max_seqlen_k=4096, scale=d ** -0.5)
        torch.cuda.synchronize()
        assert relative_error(r2, ref_r2) < 1.6e-2, attempt
        assert relative_error(out, ref_out) < 1.6e-2, attempt
        new = batch.slot_mapping
        for got, want in ((k_cache, ref_k), (v_cache, ref_v)):
            got_new, want_new = (c.view(-1, hkv, d)[new].float() for c in (got, want))
            assert (got_new - want_new).abs().max() <= 2 ** -7 * want_new.abs().max()
        if attempt == 0:
            first = out.clone()
        else:
            assert torch.equal(out, first)   # deterministic: split-K and merge sums in a fixed order


def test_layer_in_a_cuda_graph_with_an_fp8_cache() -> None:
    hidden, hq, hkv, d, _ = SHAPES["0.6b"]
    batch = random_paged_batch([900], [1], num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=64,
                               num_blocks=64, dtype=torch.bfloat16, device="cuda", seed=3)
    k_scale = torch.full((hkv, d), 0.02, device="cuda")
    v_scale = torch.rand(hkv, d, device="cuda") * 0.02 + 0.01
    k8 = quantize(batch.k_cache, k_scale, torch.float8_e4m3fn)
    v8 = to_token_major(quantize(batch.v_cache, v_scale, torch.float8_e4m3fn))
    layer, w = _layer("0.6b", seed=3)
    x = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)
    kwargs = dict(k_cache=k8, v_cache=v8, seq_lens=batch.seq_lens, block_tables=batch.block_tables,
                  positions=(batch.seq_lens - 1).long(), slot_mapping=batch.slot_mapping, max_seqlen_k=4096,
                  scale=d ** -0.5, k_scale=k_scale, v_scale=v_scale)
    layer(x, None, **kwargs)                                  # eager first: the workspace grows outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, r2 = layer(x, None, **kwargs)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    no_store = -torch.ones_like(batch.slot_mapping)
    k_ref, v_ref = dequantize(k8, k_scale).to(torch.bfloat16), dequantize(v8.contiguous(), v_scale).to(torch.bfloat16)
    ref_out, ref_r2 = decoder_layer_reference(w, x, None, batch.seq_lens, batch.block_tables, no_store, k_ref, v_ref,
                                              num_q_heads=hq, num_kv_heads=hkv, eps=EPS)
    assert relative_error(r2, ref_r2) < 2e-2
    assert relative_error(out, ref_out) < 2e-2
