"""The INT4 GEMM (nv_kernels.int4_gemm) against the bf16 GEMM of the same projection (GPU only).

For the four projections of the Qwen3-8B shape (qkv, o, gate_up, down) and M in {1, 16, 256}: checks the heuristic's
launch (`choose_config`) and a small sweep around it against the dequantize-then-matmul reference, then times
torch's bf16 F.linear (the bf16 layers' path at 256 rows; at 1 and 16 rows they take nv's skinny GEMM, timed too)
and each INT4 launch. gate_up runs as the layers run it: with SiLU-and-mul fused into the INT4 kernel and the skinny
GEMM (F.linear alone stands for bf16 at 256 rows). Each timing is a CUDA graph of calls that rotate through enough
copies of the weights that every call reads its weight from HBM, not from L2; microseconds per call are the median
over replays. Prints per shape: bf16 us, the heuristic's INT4 us, the best INT4 us and its launch, the INT4 weight
bytes' GB/s, the ratio to bf16, and the best launch without pair dequantization (the kernel's PAIRS); --json writes
them.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/bench_int4_gemm.py [--m 1,16,256]
        [--no-sweep] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from bench_small_gemm import graph_us

from nv_kernels.int4_gemm import (
    Int4GemmConfig,
    choose_config,
    int4_gemm_torch,
    int4_gemm_triton,
    pack_int4_weight,
    quantize_int4,
)
from nv_kernels.skinny_gemm import MAX_M as SKINNY_MAX_M
from nv_kernels.skinny_gemm import skinny_gemm
from nv_kernels.testing import relative_error

DTYPE = torch.bfloat16
L2_BYTES = 50 << 20
MAX_COPIES = 16
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}   # (N, K)
GATED = ("gate_up",)


def sweep(m: int, n: int, k: int, sms: int, full: bool = True,
          gated: bool = False) -> list[Int4GemmConfig]:   # n: output columns
    """The heuristic's launch first, then variants of tile width, split and stages of it and of the launch without
    pair dequantization (the GEMV at one row, tensor-core tiles above; and the tensor-core tile for one row).
    full=False: the heuristic's launch and the one it would take without pairs, only."""
    base = choose_config(m, n, k, sms, gated=gated)
    found = [base]
    if not full:
        return list(dict.fromkeys([base, choose_config(m, n, k, sms, pairs=False)]))
    groups = k // 128
    starts = [base] if not base.pairs else [base, choose_config(m, n, k, sms, pairs=False)]
    for start in starts:
        for block_n in (32, 64, 128):
            for split_k in sorted({1, 2, 4, 8, base.split_k}):
                for stages in (2, 3, 4):
                    if split_k > groups or (split_k > 1 and m > 16) or (start.pairs and block_n < 64):
                        continue
                    found.append(start._replace(block_n=block_n, split_k=split_k, num_stages=stages))
                    if m == 1 and not start.pairs:
                        found.append(Int4GemmConfig(16, block_n, True, split_k, 4, stages))
    unique = list(dict.fromkeys(found))
    return unique


def bench_shape(name: str, n: int, k: int, m: int, sms: int, full: bool = True) -> dict:
    copies = max(2, min(MAX_COPIES, math.ceil(2 * L2_BYTES / (n * k // 2))))
    weights = [0.02 * torch.randn(n, k, device="cuda", dtype=DTYPE) for _ in range(min(copies, 4))]
    int4 = [pack_int4_weight(*quantize_int4(w)) for w in weights]
    int4 = [int4[i % len(int4)] for i in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=DTYPE)
    bf16_copies = max(2, min(MAX_COPIES, math.ceil(2 * L2_BYTES / (n * k * 2))))
    bf16 = [weights[i % len(weights)].clone() for i in range(bf16_copies)]
    gated = name in GATED
    result: dict = {"shape": name, "n": n, "k": k, "m": m, "gated": gated}
    result["bf16_us"] = graph_us([lambda w=w: F.linear(x, w) for w in bf16])
    if m <= SKINNY_MAX_M:
        result["bf16_skinny_us"] = graph_us([lambda w=w: skinny_gemm(x, w, gated=gated) for w in bf16])
    want = int4_gemm_torch(x, *int4[0], gated=gated)
    timings = []
    for cfg in sweep(m, n // 2 if gated else n, k, sms, full, gated):
        if relative_error(int4_gemm_triton(x, *int4[0], config=cfg, gated=gated), want) > 2e-2:
            raise SystemExit(f"{name} m={m} {cfg}: wrong result")
        calls = [lambda q=q, c=cfg: int4_gemm_triton(x, *q, config=c, gated=gated) for q in int4]
        timings.append((graph_us(calls), cfg))
    heuristic_us = timings[0][0]
    best_us, best = min(timings, key=lambda t: t[0])
    unpaired_us = min(us for us, cfg in timings if not cfg.pairs)
    bf16_best = min(result["bf16_us"], result.get("bf16_skinny_us", math.inf))
    int4_bytes = n * k // 2 + 3 * n * (k // 128)
    result.update(int4_us=heuristic_us, best_us=best_us, best=best._asdict(), ratio=heuristic_us / bf16_best,
                  best_ratio=best_us / bf16_best, int4_GBs=int4_bytes / (heuristic_us * 1e3),
                  best_unpaired_us=unpaired_us)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="1,16,256")
    p.add_argument("--json")
    p.add_argument("--no-sweep", action="store_true",
                   help="time only the heuristic's launch and the launch it would take without pairs")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for m in (int(v) for v in args.m.split(",")):
        for name, (n, k) in SHAPES.items():
            r = bench_shape(name, n, k, m, sms, not args.no_sweep)
            results.append(r)
            print(f"{name:8s} m={m:4d} bf16 {min(r['bf16_us'], r.get('bf16_skinny_us', math.inf)):8.1f} us | int4 "
                  f"{r['int4_us']:8.1f} us ({r['int4_GBs']:6.0f} GB/s, x{r['ratio']:.2f}) | best {r['best_us']:8.1f}"
                  f" us x{r['best_ratio']:.2f} {r['best']} | without pairs {r['best_unpaired_us']:8.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
