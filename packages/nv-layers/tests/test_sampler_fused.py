"""The Sampler's dispatch to the fused Triton draw (nv_kernels.sampler_kernel, interpreted on CPU with
TRITON_INTERPRET=1, standing in for CUDA): which steps take the fast path, and equal tokens either way.
Triton decides interpretation when a kernel is defined, so the module is imported inside the fixture
with the variable set."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from nv_kernels.sampler_hash import sample_tokens_torch
from nv_kernels.testing import interpreted_triton_modules
from nv_layers.sampler import Sampler, SamplingTensors, fast_path_applies

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.sampler_kernel") as (module,):
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


def test_a_grammar_bitmask_stays_on_the_fast_path(fused: ModuleType, monkeypatch):
    """Structured outputs: the kernel reads the bitmask (same tokens as the torch path's masked_fill)."""
    sampler = Sampler()
    monkeypatch.setattr(sampler, "_fused_kernels", lambda device: fused)
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 300, generator=gen).to(torch.bfloat16)
    bitmask = torch.randint(-(2**31), 2**31, (4, 10), generator=gen, dtype=torch.int64).to(torch.int32)
    t = plain_tensors([0.8, 0.0, 1.2, 1.0], token_bitmask=bitmask)   # greedy and sampled rows
    assert fast_path_applies(t)
    assert torch.equal(sampler(logits, t).token_ids, reference(logits, t))
    assert not fast_path_applies(plain_tensors([0.7], token_bitmask=bitmask[:1], banned_token_ids=torch.tensor([[3]])))


def test_fast_path_is_off_for_other_stages():
    assert fast_path_applies(plain_tensors([0.7, 0.0]))
    assert not fast_path_applies(plain_tensors([0.7], any_top_p=True))
    assert not fast_path_applies(plain_tensors([0.7], any_min_p=True))
    assert not fast_path_applies(plain_tensors([0.7], num_logprobs=2))
    banned = plain_tensors([0.7], banned_token_ids=torch.tensor([[3]]))
    assert not fast_path_applies(banned)
    penal = plain_tensors([0.7], presence_penalties=torch.tensor([0.5]))
    assert not fast_path_applies(penal)


@pytest.mark.parametrize("temps", [[0.6, 0.0, 1.0, 0.25, 2.0, 1e-3], [0.0, 0.0], [0.9, 1.3]])
def test_torch_path_equals_the_kernels_reference(temps: list[float]):
    """The kernel is tested against sample_tokens_torch; the Sampler's torch path draws the same."""
    logits = torch.randn(len(temps), 900, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    t = plain_tensors(temps, seed=5)
    expected = sample_tokens_torch(logits, t.seeds, t.positions, t.temperatures, all_greedy=t.all_greedy)
    assert torch.equal(reference(logits, t), expected)
