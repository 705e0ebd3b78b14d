"""The fused Triton draw (nv_kernels.sampler_kernel) under TRITON_INTERPRET=1 on CPU equals its torch
reference (nv_kernels.sampler_hash.sample_tokens_torch, the sampler's torch path) token for token.
Triton decides interpretation when a kernel is defined, so the module is imported inside the fixture
with the variable set."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import NamedTuple

import pytest
import torch

from nv_kernels.sampler_hash import sample_tokens_torch
from nv_kernels.testing import interpreted_triton_modules

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    with interpreted_triton_modules("nv_kernels.sampler_kernel") as (module,):
        yield module


class Rows(NamedTuple):
    """Temperature-only sampling inputs of S rows."""

    temperatures: torch.Tensor  # [S] float32; <= 0 = greedy
    seeds: torch.Tensor  # [S] int64
    positions: torch.Tensor  # [S] int64


def plain_tensors(temps: list[float], seed: int = 0) -> Rows:
    gen = torch.Generator().manual_seed(seed)
    n = len(temps)
    return Rows(torch.tensor(temps, dtype=torch.float32),
                torch.randint(-(2**62), 2**62, (n,), generator=gen),
                torch.randint(0, 2**40, (n,), generator=gen))


def reference(logits: torch.Tensor, t: Rows) -> torch.Tensor:
    return sample_tokens_torch(logits, t.seeds, t.positions, t.temperatures,
                               all_greedy=bool((t.temperatures <= 0).all()))


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


def test_token_bitmask_allows_only_its_tokens(fused: ModuleType):
    """A grammar's bitmask read in the kernel equals the torch path's masked_fill to -inf, greedy and
    sampled, with a vocabulary that is not a multiple of 32 and rows allowing one token or all."""
    vocab, rows = 300, 4
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[1] = 0
    bitmask[1, 290 // 32] = 1 << (290 % 32)           # one token allowed, past the last full word of 32
    bitmask[2] = -1                                   # every token
    allowed = ((bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).reshape(rows, -1)[:, :vocab].bool()
    masked = logits.float().masked_fill(~allowed, float("-inf"))
    for temps in ([0.0] * rows, [0.7, 1.0, 0.0, 2.0]):
        t = plain_tensors(temps, seed=4)
        got = fused.sample_tokens(logits, t.seeds, t.positions, t.temperatures, token_bitmask=bitmask,
                                  all_greedy=not any(temps), block=64)
        assert torch.equal(got, reference(masked, t))
        assert bool(allowed.gather(1, got[:, None]).all())
        assert int(got[1]) == 290
    with pytest.raises(ValueError, match="token_bitmask"):
        fused.sample_tokens(logits, t.seeds, t.positions, t.temperatures, token_bitmask=bitmask[:, :3])
