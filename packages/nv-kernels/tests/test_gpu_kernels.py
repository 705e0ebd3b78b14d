"""Triton kernels on the GPU at real shapes against the torch reference (pytest -m gpu).

Kernel modules are imported inside the tests, so collecting this file never compiles kernels for
the wrong mode (the CPU suite interprets them).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from nv_kernels.testing import PagedBatch, fp8_code_agreement, random_paged_batch, relative_error, rotary_cos_sin
from nv_kernels.torch_backend import TorchBackend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REF = TorchBackend()
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 3e-3}
NUM_BLOCKS = 32768  # block_id * BS * Hkv * D passes 2**31 at BS >= 256 (Hkv 8, D 128)
CONTEXTS = [1, 2, 15, 16, 17, 100, 255, 256, 257, 1000, 2048, 4096]
# (Hq, Hkv, head_dim, block_size, dtype): the Qwen3-0.6B shape at every block size, plus the rest.
CASES = [(16, 8, 128, bs, dt) for bs in (16, 32, 64, 128, 256) for dt in (torch.bfloat16, torch.float16)]
CASES += [(32, 4, 64, 16, torch.float16), (32, 4, 128, 256, torch.bfloat16), (8, 8, 64, 64, torch.bfloat16),
          (8, 8, 128, 128, torch.float16), (16, 8, 64, 256, torch.float16), (32, 4, 128, 32, torch.float16)]


def _poison_workspaces(monkeypatch: pytest.MonkeyPatch) -> None:
    import nv_kernels.triton_decode as decode

    def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(*args, fill_value=float("nan"), **kwargs)

    monkeypatch.setattr(decode, "_empty", nan_empty)


def _batch(q_lens: list[int], case: tuple, seed: int, contexts: list[int] = CONTEXTS) -> PagedBatch:
    hq, hkv, d, bs, dtype = case
    return random_paged_batch(contexts, q_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                              block_size=bs, num_blocks=NUM_BLOCKS, dtype=dtype, device="cuda", seed=seed)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels.triton_decode import decode_attention

    _poison_workspaces(monkeypatch)
    b = _batch([1] * len(CONTEXTS), case, seed=case[3])
    ref = REF.decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                     max_seqlen_k=4096, scale=case[2] ** -0.5)
    for splits in (None, 1):  # the default (several splits here) and one split
        out = decode_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables, 4096,
                               case[2] ** -0.5, num_splits=splits)
        assert relative_error(out, ref) < TOL[case[4]], splits


@pytest.mark.parametrize("case", CASES[::2], ids=str)
def test_prefill_and_store(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels import get_backend

    _poison_workspaces(monkeypatch)
    q_lens = [1, 2, 15, 1, 17, 100, 200, 256, 1, 1000, 700, 512]  # fresh prompts, cached prefixes, decodes
    b = _batch(q_lens, case, seed=case[3] + 1)
    backend = get_backend("triton", "cuda")
    hq, hkv, d = case[:3]
    new_k = torch.randn(len(b.slot_mapping), hkv, d, device="cuda", dtype=case[4])
    new_v = torch.randn_like(new_k)
    slots = b.slot_mapping.clone()
    slots[::7] = -1  # padding tokens keep the old cache contents
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    REF.store_kvcache(new_k, new_v, k_ref, v_ref, slots)
    backend.store_kvcache(new_k, new_v, b.k_cache, b.v_cache, slots)
    torch.testing.assert_close(b.k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(b.v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    del k_ref, v_ref
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=d ** -0.5)
    out = backend.prefill(b.q, b.k_cache, b.v_cache, **kw)
    assert relative_error(out, REF.prefill(b.q, b.k_cache, b.v_cache, **kw)) < TOL[case[4]]


def test_decode_in_cuda_graph_with_zero_length_rows() -> None:
    """Captured once with a static max context, replayed with new lengths (incl. 0, graph padding)."""
    from nv_kernels import get_backend

    case = (16, 8, 128, 16, torch.bfloat16)
    b = _batch([1] * len(CONTEXTS), case, seed=7)
    backend = get_backend("triton", "cuda")
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


# ---- FP8 KV cache at real shapes: Triton against the torch reference on the same FP8 cache ---------------
# (Hq, Hkv, D, block size, q dtype, cache dtype, scales per (KV head, channel) as the engine calibrates them)
FP8_CASES = [(16, 8, 128, bs, torch.bfloat16, torch.float8_e4m3fn, bs != 256) for bs in (16, 64, 256)]
FP8_CASES += [(16, 8, 128, 64, torch.bfloat16, torch.float8_e5m2, True),
              (32, 4, 64, 16, torch.float16, torch.float8_e4m3fn, False)]


def _fp8_codes_match(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal FP8 bytes but for rare one-code differences (Triton's fp32 division may differ from torch's
    by an ulp, which can flip a rounding)."""
    equal, worst = fp8_code_agreement(got, want)
    assert equal > 0.999 and worst <= 1


@pytest.mark.parametrize("case", FP8_CASES, ids=str)
def test_fp8_store_decode_prefill(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels import get_backend
    from nv_kernels.kv_quant import quantize
    from nv_kernels.triton_decode import decode_attention

    _poison_workspaces(monkeypatch)
    hq, hkv, d, bs, dtype, fp8, per_channel = case
    q_lens = [1, 2, 15, 1, 17, 100, 200, 256, 1, 1000, 700, 512]
    b = _batch(q_lens, case[:5], seed=bs + 5)
    k_scale = torch.tensor([0.012], device="cuda")   # N(0, 1) keys: max |k| / k_scale ~ 400 < 448
    v_scale = torch.tensor([0.004], device="cuda")   # values: some clamp at +-448 * v_scale
    if per_channel:   # [Hkv, D]: 1..2 times the per-tensor scale, a different one for every (KV head, channel)
        gen = torch.Generator(device="cuda").manual_seed(bs)
        k_scale = k_scale * (1 + torch.rand(hkv, d, device="cuda", generator=gen))
        v_scale = v_scale * (1 + torch.rand(hkv, d, device="cuda", generator=gen))
    k_cache, v_cache = quantize(b.k_cache, k_scale, fp8), quantize(b.v_cache, v_scale, fp8)  # NaN slots stay NaN
    b.k_cache = b.v_cache = torch.empty(0)   # free the source caches (large at NUM_BLOCKS)
    backend = get_backend("triton", "cuda")
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    new_k = torch.randn(len(b.slot_mapping), hkv, d, device="cuda", dtype=dtype)
    new_v = torch.randn_like(new_k)
    slots = b.slot_mapping.clone()
    slots[::7] = -1
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    REF.store_kvcache(new_k, new_v, k_ref, v_ref, slots, **scales)
    backend.store_kvcache(new_k, new_v, k_cache, v_cache, slots, **scales)
    _fp8_codes_match(k_cache, k_ref)
    _fp8_codes_match(v_cache, v_ref)
    del k_ref, v_ref
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, block_tables=b.block_tables,
              max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, scale=d ** -0.5, **scales)
    out = backend.prefill(b.q, k_cache, v_cache, **kw)
    assert relative_error(out, REF.prefill(b.q, k_cache, v_cache, **kw)) < TOL[dtype]
    q = b.q[b.cu_seqlens_q[1:].long() - 1].contiguous()  # each sequence's last query as a decode row
    ref = REF.decode(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4096,
                     scale=d ** -0.5, **scales)
    for splits in (None, 1):   # the default (several splits here) and one split
        out = decode_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, 4096, d ** -0.5, num_splits=splits,
                               **scales)
        assert relative_error(out, ref) < TOL[dtype], splits


def test_fp8_decode_in_cuda_graph_reads_scales_at_replay() -> None:
    """The scales are read from device memory: a captured graph sees the values at replay."""
    from nv_kernels import get_backend
    from nv_kernels.kv_quant import quantize

    case = (16, 8, 128, 64, torch.bfloat16)
    b = _batch([1] * len(CONTEXTS), case, seed=9)
    k_scale, v_scale = torch.full((8, 128), 0.02, device="cuda"), torch.full((8, 128), 0.02, device="cuda")
    k_cache = quantize(b.k_cache, k_scale, torch.float8_e4m3fn)
    v_cache = quantize(b.v_cache, v_scale, torch.float8_e4m3fn)
    backend = get_backend("triton", "cuda")

    def step() -> torch.Tensor:
        return backend.decode(b.q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                              max_seqlen_k=4096, scale=0.1, k_scale=k_scale, v_scale=v_scale)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    k_scale[:, ::2] = 0.01   # per (KV head, channel): half the channels change
    v_scale[1::2] = 0.05
    graph.replay()
    ref = REF.decode(b.q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4096,
                     scale=0.1, k_scale=k_scale, v_scale=v_scale)
    assert relative_error(out, ref) < TOL[case[4]]


@pytest.mark.parametrize("cache_dtype,block_size", [(torch.bfloat16, 64), (torch.bfloat16, 16),
                                                    (torch.float8_e4m3fn, 64)])
def test_decode_with_rope_equals_norm_rope_store_then_decode(cache_dtype: torch.dtype, block_size: int) -> None:
    """The fused decode path (nv_kernels.decode_rope) at the Qwen3-0.6B shape: the new tokens' cache bytes equal
    the fused q/k-norm + rotary + store kernel's, and the output the decode kernel's over that cache."""
    from nv_kernels.decode_rope import DecodeRope
    from nv_kernels.fused_rope import qk_norm_rope_triton
    from nv_kernels.kv_layout import to_token_major
    from nv_kernels.kv_quant import quantize
    from nv_kernels.triton_backend import TritonBackend
    from nv_kernels.triton_decode import decode_attention

    hq, hkv, d = 16, 8, 128
    b = _batch([1] * len(CONTEXTS), (hq, hkv, d, block_size, torch.bfloat16), seed=3)
    gen = torch.Generator(device="cuda").manual_seed(4)
    batch = len(CONTEXTS)
    qkv = torch.randn(batch, (hq + 2 * hkv) * d, device="cuda", generator=gen).bfloat16() * 4
    q, k, v = (t.view(batch, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    q_w, k_w = ((torch.rand(d, device="cuda", generator=gen) + 0.5).bfloat16() for _ in range(2))
    cos_sin = rotary_cos_sin(8192, d, base=1e6, device="cuda")
    positions, slots = (b.seq_lens - 1).long(), b.slot_mapping.clone()
    slots[3] = -1                                                        # a padded row: stores nothing
    scales: dict[str, torch.Tensor] = {}
    k_cache, v_cache = b.k_cache.nan_to_num(), b.v_cache.nan_to_num()
    if cache_dtype != torch.bfloat16:
        scales = {"k_scale": torch.full((hkv, d), 0.02, device="cuda"),
                  "v_scale": torch.full((hkv, d), 0.03, device="cuda")}
        k_cache = quantize(k_cache, scales["k_scale"], cache_dtype)
        v_cache = to_token_major(quantize(v_cache, scales["v_scale"], cache_dtype))
    backend = TritonBackend()
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    q_out, _, _ = qk_norm_rope_triton(q, k, v, positions, cos_sin, head_dim=d, rotary_dim=d, q_weight=q_w,
                                      k_weight=k_w, k_cache=ref_k, v_cache=ref_v, slot_mapping=slots, **scales)
    ref = backend.decode(q_out, ref_k, ref_v, seq_lens=b.seq_lens, block_tables=b.block_tables, max_seqlen_k=4096,
                         scale=d ** -0.5, **scales)
    rope = DecodeRope(k=k, v=v, positions=positions, slot_mapping=slots, cos_sin_cache=cos_sin, q_weight=q_w,
                      k_weight=k_w)
    step = 2.0 ** -7 if cache_dtype == torch.bfloat16 else 2.0 ** -3    # one unit in the last place, relative
    fresh_k, fresh_v = k_cache.clone(), v_cache.clone()
    # the default (several splits here), the same with each split's first tile read ahead (PRELOAD), and one split
    # (every program owns its new token)
    for splits, preload in ((None, None), (None, True), (1, None)):
        k_cache, v_cache = fresh_k.clone(), fresh_v.clone()
        if splits is None and preload is None:
            out = backend.decode_with_rope(q, k_cache, v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                                           max_seqlen_k=4096, scale=d ** -0.5, rope=rope, **scales)
        else:
            out = decode_attention(q, k_cache, v_cache, b.seq_lens, b.block_tables, 4096, d ** -0.5,
                                   num_splits=splits, rope=rope, preload=preload, **scales)
        for got, want in ((k_cache, ref_k), (v_cache, ref_v)):
            g, w = got.contiguous().float(), want.contiguous().float()     # raw cache values (FP8 unscaled)
            differ = g != w
            assert int(differ.sum()) <= 0.01 * batch * hkv * d             # a rounding of the fp32 sums, rarely
            assert bool(((g - w).abs() <= step * w.abs() + 1e-6).all())
        assert relative_error(out.float(), ref.float()) < 1e-2


def test_batch_one_decode_chain_under_dependent_launch_equals_serial() -> None:
    """A batch-1 step's attention as the model chains it, in one CUDA graph under dependent launch: per layer a
    one-tile GEMM writes q / k / v, the fused decode (its first KV tile read before its wait, PRELOAD) stores the
    new token and attends, a GEMM reads the output. Replayed over steps (context growing across split and tile
    edges), every step's output and cache equal the same kernels run one after the other without dependent
    launch: nothing read before a wait was still being written."""
    from nv_kernels import dependent_launch
    from nv_kernels.decode_rope import DecodeRope
    from nv_kernels.skinny_gemm import skinny_gemm
    from nv_kernels.skinny_gemm_config import SkinnyGemmConfig
    from nv_kernels.triton_decode import decode_attention

    device = torch.device("cuda", torch.cuda.current_device())
    if not dependent_launch.dependent_launch_enabled(device, 1):
        pytest.skip("no programmatic dependent launch on this GPU / triton")
    hq, hkv, d, hidden, layers, bs = 16, 8, 128, 1024, 4, 64
    gen = torch.Generator("cuda").manual_seed(11)
    w_qkv = [(torch.randn((hq + 2 * hkv) * d, hidden, generator=gen, device="cuda") / 32).bfloat16()
             for _ in range(layers)]
    w_o = [(torch.randn(hidden, hq * d, generator=gen, device="cuda") / 45).bfloat16() for _ in range(layers)]
    caches = [(torch.randn(64, bs, hkv, d, generator=gen, device="cuda").bfloat16(),
               torch.randn(64, bs, hkv, d, generator=gen, device="cuda").bfloat16()) for _ in range(layers)]
    table = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:40].int().view(1, 40).cuda()
    seq_lens = torch.zeros(1, dtype=torch.int32, device="cuda")
    positions = torch.zeros(1, dtype=torch.int64, device="cuda")
    slots = torch.zeros(1, dtype=torch.int64, device="cuda")
    cos_sin = rotary_cos_sin(4096, d, base=1e6, device="cuda")
    norm_w = (torch.rand(d, generator=gen, device="cuda") + 0.5).bfloat16()
    one_tile = SkinnyGemmConfig(block_n=8, block_k=1024, num_warps=2, num_stages=1, use_dot=False)

    def chain(x: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        for layer in range(layers):
            qkv = skinny_gemm(x, w_qkv[layer], config=one_tile)
            q, k, v = (t.view(1, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
            rope = DecodeRope(k=k, v=v, positions=positions, slot_mapping=slots, cos_sin_cache=cos_sin,
                              q_weight=norm_w, k_weight=norm_w)
            attn = decode_attention(q, *kv[layer], seq_lens, table, 4096, d ** -0.5, rope=rope, preload=True)
            x = skinny_gemm(attn.view(1, -1), w_o[layer]) + x
        return x

    def stage(context: int) -> None:
        seq_lens.fill_(context)
        positions.fill_(context - 1)
        slots.fill_(int(table[0, (context - 1) // bs]) * bs + (context - 1) % bs)

    x = torch.randn(1, hidden, generator=gen, device="cuda").bfloat16()
    stage(600)
    chain(x, [(k.clone(), v.clone()) for k, v in caches])                # compile outside the capture
    graph_kv = [(k.clone(), v.clone()) for k, v in caches]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x, graph_kv)
    serial_kv = [(k.clone(), v.clone()) for k, v in caches]
    for context in (600, 601, 1023, 1024, 1025, 1087, 1088, 2000):     # the new token first / last in a tile
        stage(context)
        graph.replay()
        previous = dependent_launch.set_dependent_launch(False)
        try:
            serial = chain(x, serial_kv)
        finally:
            dependent_launch.set_dependent_launch(previous)
        assert torch.equal(out, serial), context
        for (gk, gv), (sk, sv) in zip(graph_kv, serial_kv, strict=True):
            assert torch.equal(gk, sk) and torch.equal(gv, sv), context
