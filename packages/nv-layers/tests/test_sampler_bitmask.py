"""The sampler's token bitmask (structured outputs): bit j of word w allows token 32w + j; every other
token is -inf before penalties and temperature. Rows with an all-ones mask sample as without one.
CPU tests, plus a GPU test (no host sync, same tokens as on CPU, mask cost at [256, 151936])."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nv_layers.sampler import Sampler, SamplingTensors, bitmask_allows


def pack(allowed: list[set[int] | None], vocab: int) -> torch.Tensor:
    """[S, ceil(V/32)] int32 bitmask; None rows allow everything."""
    bits = np.zeros((len(allowed), (vocab + 31) // 32 * 32), dtype=np.uint8)
    for row, ids in enumerate(allowed):
        if ids is None:
            bits[row] = 1
        else:
            bits[row, sorted(ids)] = 1
    words = np.packbits(bits.reshape(len(allowed), -1, 32), axis=-1, bitorder="little")  # [S, W, 4] bytes
    return torch.from_numpy(words.copy().view(np.int32)[..., 0])


def tensors(num_rows: int, temperature: float, bitmask: torch.Tensor | None, device: str = "cpu",
            **kw) -> SamplingTensors:
    temps = torch.full((num_rows,), temperature, device=device)
    return SamplingTensors(
        temperatures=temps, top_k=torch.zeros(num_rows, dtype=torch.int64, device=device),
        top_p=torch.ones(num_rows, device=device), min_p=torch.zeros(num_rows, device=device),
        seeds=torch.arange(num_rows, device=device), positions=torch.full((num_rows,), 3, device=device),
        token_bitmask=None if bitmask is None else bitmask.to(device), all_greedy=temperature == 0.0,
        any_greedy=temperature == 0.0, any_top_k=False, any_top_p=False, any_min_p=False, **kw)


def test_bitmask_allows_matches_the_bits():
    vocab = 1000                               # not a multiple of 32: the last word is partial
    rng = np.random.default_rng(0)
    allowed = [set(rng.choice(vocab, 40, replace=False).tolist()) | {31, 63, 999} for _ in range(3)] + [None]
    mask = bitmask_allows(pack(allowed, vocab), vocab)
    assert mask.shape == (4, vocab) and mask.dtype == torch.bool
    for row, ids in enumerate(allowed):
        expected = set(range(vocab)) if ids is None else ids
        assert set(torch.nonzero(mask[row]).flatten().tolist()) == expected


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampled_tokens_stay_in_the_mask_and_unmasked_rows_are_unchanged(temperature):
    num_rows, vocab = 64, 500
    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(1))
    allowed = [{(row * 7) % vocab, (row * 13 + 5) % vocab, 499} if row % 2 else None for row in range(num_rows)]
    out = Sampler(use_triton=False)(logits, tensors(num_rows, temperature, pack(allowed, vocab)))
    free = Sampler(use_triton=False)(logits, tensors(num_rows, temperature, None))
    for row, ids in enumerate(allowed):
        token = int(out.token_ids[row])
        if ids is None:
            assert token == int(free.token_ids[row])          # same seed, same draw
        else:
            assert token in ids
            if temperature == 0.0:
                assert token == max(ids, key=lambda t: float(logits[row, t]))


def test_mask_applies_before_logit_bias_and_logprobs_stay_raw():
    vocab = 64
    logits = torch.zeros(1, vocab)
    logits[0, 5] = 10.0
    t = tensors(1, 0.0, pack([{7, 9}], vocab), need_logprobs=True,
                logit_bias_ids=torch.tensor([[5, 9]]), logit_bias_values=torch.tensor([[100.0, 1.0]]))
    out = Sampler(use_triton=False)(logits, t)
    assert int(out.token_ids[0]) == 9                         # 5 has the largest logit + bias, but is masked
    assert out.logprobs is not None
    torch.testing.assert_close(out.logprobs[0], torch.log_softmax(logits[0], -1)[9])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bitmask_on_cuda_no_host_sync_same_tokens_and_cost():
    num_rows, vocab = 256, 151936
    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(0))
    allowed = [set(range(row, vocab, 97)) if row % 2 else None for row in range(num_rows)]
    bitmask = pack(allowed, vocab)
    t_gpu = tensors(num_rows, 0.8, bitmask, "cuda")
    sampler = Sampler()
    logits_gpu = logits.cuda()
    sampler(logits_gpu, t_gpu)                                # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = sampler(logits_gpu, t_gpu)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = Sampler()(logits, tensors(num_rows, 0.8, bitmask))
    assert int((out.token_ids.cpu() != cpu.token_ids).sum()) <= 2
    for row, ids in enumerate(allowed):
        if ids is not None:
            assert int(out.token_ids[row]) in ids
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    no_mask = tensors(num_rows, 0.8, None, "cuda", need_logprobs=True)   # the torch path, without the mask
    times = {}
    for name, t in (("mask", t_gpu), ("no_mask", no_mask)):
        start.record()
        for _ in range(20):
            sampler(logits_gpu, t)
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / 20
    print(f"sampler at [256, 151936] with / without a grammar bitmask: {times} ms/step")
