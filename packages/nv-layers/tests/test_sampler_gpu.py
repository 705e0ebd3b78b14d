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
    fused, plain = Sampler(), Sampler(use_triton=False)
    fused(logits.cuda(), tensors)  # warm-up: token keys, Triton compile
    plain(logits.cuda(), tensors)
    logits_gpu = logits.cuda()  # the host-to-device copy itself synchronises: do it before
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused(logits_gpu, tensors)
        out_plain = plain(logits_gpu, tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = Sampler()(logits, full_tensors(num_rows, "cpu"))
    # The hash is bit-exact everywhere; `log` may differ by an ulp per device, so a near-tie may
    # rarely flip: allow 2 of 256 rows.
    assert int((out.token_ids.cpu() != cpu.token_ids).sum()) <= 2
    assert int((out_plain.token_ids.cpu() != cpu.token_ids).sum()) <= 2
    torch.testing.assert_close(out.logprobs.cpu(), cpu.logprobs, atol=1e-4, rtol=0)
    assert torch.equal(out.token_ids, fused(logits.cuda(), tensors).token_ids)  # run to run


def test_fused_draw_is_faster_than_torch_path():
    num_rows, vocab = 256, 151936
    logits = torch.randn(num_rows, vocab, device="cuda")
    tensors = full_tensors(num_rows, "cuda")
    tensors.repetition_penalties = tensors.presence_penalties = None
    tensors.banned_token_ids = tensors.prompt_token_ids = tensors.output_token_ids = None
    tensors.any_top_k = tensors.any_top_p = tensors.any_min_p = tensors.any_greedy = False
    tensors.need_logprobs, tensors.num_logprobs = False, 0
    times = {}
    for name, sampler in (("fused", Sampler()), ("torch", Sampler(use_triton=False))):
        sampler(logits, tensors)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            sampler(logits, tensors)
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / 20
    print(f"sampler at [256, 151936], plain temperature sampling: {times} ms/step")
    assert times["fused"] < times["torch"]


def test_fast_path_on_bf16_logits_matches_torch_path_without_sync():
    """Temperature-only sampling (the benchmark's case) on raw bf16 logits: the fused kernels."""
    num_rows, vocab = 256, 151936
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(num_rows, vocab, generator=gen) * 4).to(torch.bfloat16)
    temps = torch.tensor([0.0 if i % 8 == 0 else 0.6 for i in range(num_rows)])
    def tensors(device: str) -> SamplingTensors:
        return SamplingTensors(
            temperatures=temps.to(device), top_k=torch.zeros(num_rows, dtype=torch.int32,
                                                             device=device),
            top_p=torch.ones(num_rows, device=device), min_p=torch.zeros(num_rows, device=device),
            seeds=torch.arange(num_rows, device=device) * 7919 - 10**12,
            positions=torch.full((num_rows,), 123, device=device),
            all_greedy=False, any_greedy=True, any_top_k=False, any_top_p=False, any_min_p=False)
    on_gpu, sampler = tensors("cuda"), Sampler()
    logits_gpu = logits.cuda()
    sampler(logits_gpu, on_gpu)  # warm-up: Triton compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = sampler(logits_gpu, on_gpu).token_ids
        greedy_only = SamplingTensors(**{**on_gpu.__dict__, "all_greedy": True})
        got_greedy = sampler(logits_gpu, greedy_only).token_ids
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = Sampler(use_triton=False)(logits, tensors("cpu")).token_ids
    assert int((got.cpu() != want).sum()) <= 2
    greedy = temps <= 0
    assert torch.equal(got.cpu()[greedy], logits.float().argmax(-1)[greedy])
    assert torch.equal(got_greedy.cpu(), logits.float().argmax(-1))
