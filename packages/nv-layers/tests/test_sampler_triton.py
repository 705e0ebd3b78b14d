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

from nv_layers.sampler import gumbel_noise, row_keys, token_keys

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        if "nv_layers.sampler_triton" in sys.modules and "TRITON_INTERPRET" not in os.environ:
            pytest.skip("the kernel was already compiled for the GPU in this process")
        mp.setenv("TRITON_INTERPRET", "1")
        import nv_layers.sampler_triton as module
        yield module


@pytest.mark.parametrize("vocab,block", [(3000, 1024), (777, 256), (64, 2048)])
def test_fused_draw_equals_torch_path(fused: ModuleType, vocab: int, block: int):
    gen = torch.Generator().manual_seed(vocab)
    num_rows = 24
    scores = torch.randn(num_rows, vocab, generator=gen) * 2
    scores[::3, ::2] = float("-inf")  # masked tokens (top-k / top-p) are never drawn
    seeds = torch.randint(-(2**62), 2**62, (num_rows,), generator=gen)
    keys = row_keys(seeds, torch.arange(num_rows) * 7)
    tok = token_keys(vocab, "cpu")
    got = fused.gumbel_argmax(scores, keys, tok, block=block)
    want = (scores + gumbel_noise(keys, tok)).argmax(dim=-1)
    assert torch.equal(got, want)
    assert bool(torch.isfinite(scores.gather(1, got[:, None])).all())


def test_fused_draw_on_strided_rows(fused: ModuleType):
    base = torch.randn(5, 300)
    scores = base[:, :200]  # row stride 300
    keys = row_keys(torch.arange(5), torch.zeros(5, dtype=torch.int64))
    tok = token_keys(200, "cpu")
    got = fused.gumbel_argmax(scores, keys, tok, block=64)
    assert torch.equal(got, (scores + gumbel_noise(keys, tok)).argmax(dim=-1))
