"""Sampler on CUDA: no host sync at the real vocab size, and the same tokens as on CPU."""
from __future__ import annotations

import pytest
import torch

from nv_layers.sampler import Sampler, SamplingTensors

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def full_tensors(num_rows: int, device: str) -> SamplingTensors:
    """Every stage on: mixed greedy / sampled rows, penalties, bans and logprobs."""
    def col(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)
    rows = range(num_rows)
    pad = torch.full((num_rows, 4), 151936, dtype=torch.int64, device=device)
    pad[:, 0] = torch.arange(num_rows, device=device)
    return SamplingTensors(
        temperatures=col([0.0 if i % 4 == 0 else 0.8 for i in rows], torch.float32),
        top_k=col([(i % 3) * 20 for i in rows], torch.int32),
        top_p=col([0.9 if i % 2 else 1.0 for i in rows], torch.float32),
        min_p=col([0.05 if i % 5 == 1 else 0.0 for i in rows], torch.float32),
        seeds=col(list(rows), torch.int64), positions=col([7] * num_rows, torch.int64),
        num_logprobs=5, need_logprobs=True,
        repetition_penalties=col([1.1] * num_rows, torch.float32),
        presence_penalties=col([0.2] * num_rows, torch.float32),
        prompt_token_ids=pad, output_token_ids=pad.clone(), banned_token_ids=pad.clone())


def test_no_host_sync_and_same_tokens_as_cpu():
    num_rows, vocab = 256, 151936
    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(0))
    tensors = full_tensors(num_rows, "cuda")
    sampler = Sampler()
    sampler(logits.cuda(), tensors)  # warm-up (allocates the token-key buffer)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = sampler(logits.cuda(), tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = Sampler()(logits, full_tensors(num_rows, "cpu"))
    assert torch.equal(out.token_ids.cpu(), cpu.token_ids)
    torch.testing.assert_close(out.logprobs.cpu(), cpu.logprobs, atol=1e-4, rtol=0)
