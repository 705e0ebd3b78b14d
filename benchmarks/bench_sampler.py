"""Micro-benchmark of the sampler on one GPU: the old path against the fused fast path.

Temperature-only sampling (BENCHMARK.md's setting: temperature 0.6, no top-k/top-p/min-p, no
penalties, no logprobs) on bf16 logits [S, 151,936] as the LM head writes them, at S = 256 and 16.

- old: what the sampler ran before the fast path: logits.float(), / temperatures, row keys in
  ~35 small torch ops, then the one-program-per-row Gumbel-max kernel (kept below as it was).
- torch: the pure torch path (Sampler(use_triton=False)).
- new: Sampler() (nv_layers.sampler_kernel.sample_tokens: two launches on the bf16 logits), and the
  kernel alone at a few chunk counts per row; greedy (all_greedy) old vs new.
Also checks that old and new pick the same tokens (the hash is bit-identical; `log` may differ in the
last ulp, so a near-tie may flip: a few rows at most).

    PYTHONPATH=packages/nv-layers/src python3 benchmarks/bench_sampler.py
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from nv_kernels import sampler_kernel
from nv_layers.sampler import Sampler, SamplingTensors, row_keys, token_keys

VOCAB, TEMPERATURE = 151936, 0.6


@triton.jit
def _old_gumbel_argmax_kernel(scores_ptr, stride_s, row_keys_ptr, tok_keys_ptr, out_ptr, vocab,
                              BLOCK: tl.constexpr):
    # The kernel before the fast path (one program per row), for the baseline.
    row = tl.program_id(0)
    key = tl.load(row_keys_ptr + row).to(tl.uint32)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < vocab
        score = tl.load(scores_ptr + row * stride_s + offs, mask=mask, other=float("-inf"))
        tok = tl.load(tok_keys_ptr + offs, mask=mask, other=0).to(tl.uint32)
        bits = sampler_kernel._mix32(tok ^ key)
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        val = score - tl.log(-tl.log(u))
        better = mask & (val > best_val)
        best_val = tl.where(better, val, best_val)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.reduce(best_val, 0, sampler_kernel._max2)
    idx = tl.reduce(tl.where(best_val == top, best_idx, vocab), 0, sampler_kernel._min2)
    tl.store(out_ptr + row, idx.to(tl.int64))


def old_sample(logits: torch.Tensor, t: SamplingTensors, tok_keys: torch.Tensor) -> torch.Tensor:
    scaled = logits.float() / t.temperatures[:, None]  # [S, V] fp32: two full passes
    keys = row_keys(t.seeds, t.positions)  # [S]
    out = torch.empty(scaled.shape[0], dtype=torch.int64, device=scaled.device)
    _old_gumbel_argmax_kernel[(scaled.shape[0],)](scaled, scaled.stride(0), keys, tok_keys, out,
                                                  VOCAB, BLOCK=2048)
    return out


def tensors(num_rows: int, *, greedy: bool = False) -> SamplingTensors:
    dev = "cuda"
    temp = 0.0 if greedy else TEMPERATURE
    return SamplingTensors(
        temperatures=torch.full((num_rows,), temp, device=dev),
        top_k=torch.zeros(num_rows, dtype=torch.int32, device=dev),
        top_p=torch.ones(num_rows, device=dev), min_p=torch.zeros(num_rows, device=dev),
        seeds=torch.randint(0, 2**62, (num_rows,), device=dev),
        positions=torch.full((num_rows,), 100, device=dev),
        all_greedy=greedy, any_greedy=greedy, any_top_k=False, any_top_p=False, any_min_p=False)


def median_us(fn) -> float:
    return 1000.0 * float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def bench(num_rows: int) -> None:
    logits = (torch.randn(num_rows, VOCAB, device="cuda") * 3).to(torch.bfloat16)  # [S, V]
    t, t_greedy = tensors(num_rows), tensors(num_rows, greedy=True)
    tok = token_keys(VOCAB, "cuda")
    new, plain = Sampler(), Sampler(use_triton=False)
    old_ids, new_ids = old_sample(logits, t, tok), new(logits, t).token_ids
    differ = int((old_ids != new_ids).sum())
    results = {
        "old (float + div + row_keys + 1 program/row kernel)": median_us(
            lambda: old_sample(logits, t, tok)),
        "torch path (no triton)": median_us(lambda: plain(logits, t)),
        "new: Sampler() fast path": median_us(lambda: new(logits, t)),
    }
    for chunks in (4, 8, 16, 32, 64):
        results[f"new kernel, {chunks} chunks/row"] = median_us(
            lambda c=chunks: sampler_kernel.sample_tokens(logits, t.seeds, t.positions,
                                                          t.temperatures, num_chunks=c))
    results["greedy old (float + argmax)"] = median_us(lambda: logits.float().argmax(-1))
    results["greedy torch argmax on bf16"] = median_us(lambda: logits.argmax(-1))
    results["greedy new: Sampler() all_greedy"] = median_us(lambda: new(logits, t_greedy))
    greedy_ok = torch.equal(new(logits, t_greedy).token_ids, logits.argmax(-1))
    default = sampler_kernel.default_num_chunks(num_rows, VOCAB, 1024)
    print(f"\n== batch {num_rows}, vocab {VOCAB}, bf16 logits, temperature {TEMPERATURE} "
          f"(default {default} chunks/row) ==")
    for name, us in results.items():
        print(f"  {name:<52} {us:9.1f} us")
    saved = results["old (float + div + row_keys + 1 program/row kernel)"] - results[
        "new: Sampler() fast path"]
    print(f"  saving per step: {saved:.1f} us; rows differing old vs new: {differ} of {num_rows}"
          f"; greedy equals torch.argmax: {greedy_ok}")


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for num_rows in (256, 16):
        bench(num_rows)


if __name__ == "__main__":
    main()
