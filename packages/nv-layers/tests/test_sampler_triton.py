"""The fused Triton draw (nv_layers.sampler_triton) under TRITON_INTERPRET=1 on CPU equals the torch
path token for token. Triton decides interpretation when a kernel is defined, so the module is
imported inside the fixture with the variable set."""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from nv_layers.sampler import Sampler, SamplingTensors, fast_path_applies

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        if "nv_layers.sampler_triton" in sys.modules and "TRITON_INTERPRET" not in os.environ:
            pytest.skip("the kernel was already compiled for the GPU in this process")
        mp.setenv("TRITON_INTERPRET", "1")
        import nv_layers.sampler_triton as module
        yield module


def plain_tensors(temps: list[float], seed: int = 0, **kw) -> SamplingTensors:
    """Temperature-only sampling (the fast path's case), exact flags."""
    n = len(temps)
    t = torch.tensor(temps, dtype=torch.float32)
    flags = dict(all_greedy=bool((t <= 0).all()), any_greedy=bool((t <= 0).any()),
                 any_top_k=False, any_top_p=False, any_min_p=False)
    flags.update(kw)
    gen = torch.Generator().manual_seed(seed)
    return SamplingTensors(
        temperatures=t, top_k=torch.zeros(n, dtype=torch.int32), top_p=torch.ones(n),
        min_p=torch.zeros(n), seeds=torch.randint(-(2**62), 2**62, (n,), generator=gen),
        positions=torch.randint(0, 2**40, (n,), generator=gen), **flags)


def reference(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    return Sampler(use_triton=False)(logits, t).token_ids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab,block,chunks", [(3000, 512, None), (777, 64, 5), (64, 1024, None)])
def test_fast_path_equals_torch_path(fused: ModuleType, dtype: torch.dtype, vocab: int, block: int,
                                     chunks: int | None):
    gen = torch.Generator().manual_seed(vocab)
    temps = [0.6, 0.0, 1.0, 0.25, 2.0, 0.0, 0.6, 1e-3] * 3
    logits = (torch.randn(len(temps), vocab, generator=gen) * 3).to(dtype)
    logits[::3, ::2] = float("-inf")  # masked tokens are never drawn
    t = plain_tensors(temps, seed=vocab)
    got = fused.sample_tokens(logits, t.seeds, t.positions, t.temperatures, block=block,
                              num_chunks=chunks)
    assert torch.equal(got, reference(logits, t))
    greedy = t.temperatures <= 0
    assert torch.equal(got[greedy], logits.float().argmax(-1)[greedy])
    assert bool(torch.isfinite(logits.float().gather(1, got[:, None])).all())


def test_ties_take_the_first_index_like_torch_argmax(fused: ModuleType):
    # bf16 logits of a few distinct values: many exact ties inside and across chunks.
    vocab = 1000
    logits = torch.randint(0, 3, (6, vocab), generator=torch.Generator().manual_seed(1)).float()
    logits[1] = 0.0  # all equal: index 0
    logits[2, :] = float("-inf")  # all -inf: index 0, like torch.argmax
    logits[3, 700] = logits[3, 901] = 5.0  # the maximum in two chunks
    logits[4, 130] = logits[4, 131] = 5.0  # twice in one lane's neighbourhood
    logits = logits.to(torch.bfloat16)
    t = plain_tensors([0.0] * 6)
    for chunks in (1, 3, 8):
        got = fused.sample_tokens(logits, t.seeds, t.positions, t.temperatures, block=64,
                                  num_chunks=chunks)
        assert torch.equal(got, logits.float().argmax(-1)), chunks
        all_greedy = fused.sample_tokens(logits, t.seeds, t.positions, None, all_greedy=True,
                                         block=64, num_chunks=chunks)
        assert torch.equal(all_greedy, got)


def test_prescaled_scores_and_strided_rows(fused: ModuleType):
    base = torch.randn(5, 300, generator=torch.Generator().manual_seed(2))
    scores = base[:, :200]  # row stride 300
    t = plain_tensors([1.0] * 5)
    got = fused.sample_tokens(scores, t.seeds, t.positions, None, block=64)  # no temperature
    assert torch.equal(got, reference(scores.contiguous(), t))


def test_sampler_dispatch_uses_kernels_on_both_paths(fused: ModuleType, monkeypatch):
    """The Sampler's wiring, with the interpreted kernels standing in for CUDA."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("all_greedy"))
        return fused.sample_tokens(*args, **kwargs)

    kernels = ModuleType("kernels")
    kernels.sample_tokens = spy
    sampler = Sampler()
    monkeypatch.setattr(sampler, "_fused_kernels", lambda device: kernels)
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    temps = [0.6, 0.0, 1.0, 0.9, 0.0, 0.6, 1.5, 0.7]
    fast = plain_tensors(temps)
    assert fast_path_applies(fast)
    assert torch.equal(sampler(logits, fast).token_ids, reference(logits, fast))
    assert calls == [False]
    # Top-k on: torch filters, then the kernel's draw (scores already scaled); greedy rows kept.
    filtered = plain_tensors(temps, any_top_k=True, max_top_k=20)
    filtered.top_k[:] = 20
    assert not fast_path_applies(filtered)
    assert torch.equal(sampler(logits, filtered).token_ids, reference(logits, filtered))
    assert calls == [False, None]
    # Logprobs wanted: the torch path computes them, the draw still uses the kernel.
    with_logprobs = plain_tensors(temps, need_logprobs=True)
    assert not fast_path_applies(with_logprobs)
    out = sampler(logits, with_logprobs)
    assert torch.equal(out.token_ids, reference(logits, with_logprobs)) and out.logprobs is not None
    greedy = plain_tensors([0.0] * 8, any_top_k=True)  # all greedy ignores the filters
    assert fast_path_applies(greedy)
    assert torch.equal(sampler(logits, greedy).token_ids, logits.float().argmax(-1))
    assert calls[-1] is True


def test_fast_path_is_off_for_other_stages():
    assert fast_path_applies(plain_tensors([0.7, 0.0]))
    assert not fast_path_applies(plain_tensors([0.7], any_top_p=True))
    assert not fast_path_applies(plain_tensors([0.7], any_min_p=True))
    assert not fast_path_applies(plain_tensors([0.7], num_logprobs=2))
    banned = plain_tensors([0.7], banned_token_ids=torch.tensor([[3]]))
    assert not fast_path_applies(banned)
    penal = plain_tensors([0.7], presence_penalties=torch.tensor([0.5]))
    assert not fast_path_applies(penal)
