"""The bandwidth floor of `nv bench serve`'s headline requests at a fixed concurrency (no GPU needed).

A closed-loop client keeps CONCURRENCY requests in flight; a finished request's slot takes the next one at once.
Each engine step then decodes one token of every running request and prefills the prompts that joined. The floor
of a step: weights + the KV bytes of every running context read once at the copy bandwidth, plus the new prompts'
GEMM FLOPs at a share of the tensor-core peak. Output tokens over the summed floors is the fastest any engine could
serve this request set on that GPU; nv's and vLLM's measured rates are quoted against it in BENCHMARKS.md.

    python3 benchmarks/serve_floor.py [--concurrency 16,64,256] [--bandwidth 4.27e12] [--peak-flops 989e12]
        [--flops-share 0.6] [--num-prompts 256] [--max-token-id 10000] [--kv-cache-dtype auto|fp8]

Model: the Qwen3-0.6B shape in bf16 (1.19 GB of weights read per step, 28 layers x 8 KV heads x 128 dims of K
and V per token, 2 bytes each, or 1 with --kv-cache-dtype fp8 / fp8_e5m2).
"""
from __future__ import annotations

import argparse

from nv_engine.entrypoints.bench.throughput import make_workload

WEIGHT_BYTES = 1.19e9                      # Qwen3-0.6B in bf16, tied LM head counted once
KV_ELEMENTS_PER_TOKEN = 28 * 8 * 128 * 2  # layers x KV heads x head_dim x (K, V)
KV_ELEMENT_BYTES = {"auto": 2, "fp8": 1, "fp8_e5m2": 1}   # the model's bf16, or an FP8 cache
FLOPS_PER_PROMPT_TOKEN = 2 * 0.6e9         # the GEMMs of one prompt token


def floor_seconds(requests: list[tuple[int, int]], concurrency: int, bandwidth: float, flops: float,
                  kv_bytes_per_token: int) -> tuple[float, int, int]:
    """(floor seconds, output tokens, steps) of serving (prompt length, output length) requests."""
    waiting = list(reversed(requests))
    running: list[tuple[int, int]] = []    # (context length, tokens still to generate)
    seconds, tokens, steps = 0.0, 0, 0
    while waiting or running:
        joining = [waiting.pop() for _ in range(min(len(waiting), concurrency - len(running)))]
        kv_bytes = sum(context for context, _ in running) * kv_bytes_per_token
        seconds += (WEIGHT_BYTES + kv_bytes) / bandwidth
        seconds += sum(prompt for prompt, _ in joining) * FLOPS_PER_PROMPT_TOKEN / flops
        steps += 1
        tokens += len(running) + len(joining)       # a joining prompt's prefill gives its first token
        running = [(context + 1, left - 1) for context, left in running + joining if left > 1]
    return seconds, tokens, steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="16,64,256")
    p.add_argument("--bandwidth", type=float, default=4.27e12, help="copy bandwidth, bytes/s (H200: 4.27e12)")
    p.add_argument("--peak-flops", type=float, default=989e12, help="dense bf16 tensor-core peak (H200: 989e12)")
    p.add_argument("--flops-share", type=float, default=0.6, help="share of the peak a prefill GEMM reaches")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--max-token-id", type=int, default=10000, help="as nv bench serve's (it moves the lengths)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_ELEMENT_BYTES),
                   help="the KV cache's dtype (fp8: 1 byte per element, half the KV bytes)")
    args = p.parse_args()
    work = make_workload(args.num_prompts, max_token_id=args.max_token_id)
    requests = [(len(prompt), max_tokens) for prompt, max_tokens in zip(work.prompts, work.max_tokens, strict=True)]
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        seconds, tokens, steps = floor_seconds(requests, concurrency, args.bandwidth,
                                               args.peak_flops * args.flops_share,
                                               KV_ELEMENTS_PER_TOKEN * KV_ELEMENT_BYTES[args.kv_cache_dtype])
        print(f"concurrency {concurrency}: {tokens:,} output tokens in {steps:,} steps, floor {seconds:.2f} s "
              f"-> {tokens / seconds:,.0f} output tok/s")


if __name__ == "__main__":
    main()
