"""The W8A8 block-FP8 GEMM (nv_kernels.fp8_block_gemm, the path past 16 rows: decode batches and prefill) against
torch's bf16 GEMM, per Qwen3-8B projection (GPU only).

For each projection (qkv, o, gate_up without its SiLU-and-mul, down) and M in {256, 2048, 8192}: times torch's
F.linear on bf16 weights, `fp8_block_gemm_triton` as the layers call it (the activations' quantization, then the
GEMM on FP8 codes with the launch `tile_shape` picks), the quantization alone, and the GEMM alone over a list of
launches (tile rows and columns, warps, stages, one or two 128-input groups a step), each checked against the
dequantize-then-matmul reference first. Each timing is a CUDA graph of calls that rotate through enough copies of the
weights that each call reads its weight from HBM; microseconds per call are the median over replays. Prints per
shape: bf16 us, the layers' us and the ratio, the quantization's us, the heuristic's launch and the three fastest;
--json writes them.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/bench_w8a8_gemm.py [--m 256,2048,8192]
        [--full] [--json out.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import torch.nn.functional as F
from bench_int4_gemm import DTYPE, L2_BYTES, SHAPES
from bench_small_gemm import graph_us

from nv_kernels.fp8_block_gemm import (
    GROUP,
    W8A8Launch,
    choose_launch,
    fp8_block_gemm_torch,
    fp8_block_gemm_triton,
    gemm_on_codes,
    quantize_activations_triton,
    quantize_fp8_block,
)
from nv_kernels.testing import relative_error

MAX_COPIES = 8
TOLERANCE = 1e-2          # relative error against the reference (both round x to FP8 the same way)


# the launches timed besides the heuristic's (--full: every combination of these values)
LAUNCHES = [W8A8Launch(128, 128, 8, 3, False), W8A8Launch(128, 128, 8, 3, True), W8A8Launch(128, 128, 8, 4, False),
            W8A8Launch(128, 128, 4, 3, False), W8A8Launch(64, 128, 4, 4, False), W8A8Launch(64, 128, 4, 4, True),
            W8A8Launch(128, 64, 4, 4, False), W8A8Launch(64, 64, 4, 4, False), W8A8Launch(128, 128, 8, 2, False),
            W8A8Launch(64, 128, 4, 3, False)]


def launch_candidates(m: int, n: int, k: int, sms: int, full: bool = False) -> list[W8A8Launch]:
    """The heuristic's launch (`choose_launch`) first, then LAUNCHES (or, with `full`, every combination of 64 / 128
    rows and columns, 4 / 8 warps, 2-4 stages and one or two groups a step); two groups a step only where K is a
    multiple of 256, as the kernel needs."""
    paired_ok = k % (2 * GROUP) == 0
    grid = (itertools.starmap(W8A8Launch, itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4), (False, True)))
            if full else LAUNCHES)
    found = [choose_launch(m, n, k, sms)] + [launch for launch in grid if paired_ok or not launch.paired]
    return list(dict.fromkeys(found))


def bench_shape(name: str, n: int, k: int, m: int, sms: int, full: bool) -> dict:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    copies = max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / (n * k))))
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    weights = [(torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(DTYPE) for _ in range(copies)]
    quantized = [quantize_fp8_block(w) for w in weights]
    x = torch.randn(m, k, device="cuda", generator=gen).to(DTYPE)
    calls = max(copies, 4)
    bf16_us = graph_us([lambda i=i: F.linear(x, weights[i % copies]) for i in range(calls)])
    layers_us = graph_us([lambda i=i: fp8_block_gemm_triton(x, *quantized[i % copies]) for i in range(calls)])
    quant_us = graph_us([lambda: quantize_activations_triton(x) for _ in range(calls)])
    x_q, x_scale = quantize_activations_triton(x)
    want = fp8_block_gemm_torch(x.float(), *quantized[0])
    y = torch.empty(m, n, dtype=DTYPE, device="cuda")
    timed, failed = [], []
    for launch in launch_candidates(m, n, k, sms, full):
        try:
            gemm_on_codes(x_q, x_scale, *quantized[0], None, y, launch)
        except (OutOfResources, CompilationError):
            continue
        err = relative_error(y, want)
        if not err < TOLERANCE:
            failed.append({"launch": launch._asdict(), "rel_err": err})
            continue
        us = graph_us([lambda i=i, c=launch: gemm_on_codes(x_q, x_scale, *quantized[i % copies], None, y, c)
                       for i in range(calls)])
        timed.append({"launch": launch._asdict(), "us": us})
    best = sorted(timed, key=lambda r: r["us"])[:3]
    print(f"{name:8s} M={m:<5d} bf16 {bf16_us:8.1f} us | W8A8 {layers_us:8.1f} us (x{bf16_us / layers_us:4.2f}) | "
          f"quantize {quant_us:6.1f} us | heuristic's GEMM {timed[0]['us'] if timed else float('nan'):8.1f} us | "
          + "; ".join(f"{r['us']:.1f} us {tuple(r['launch'].values())}" for r in best), flush=True)
    for f in failed:
        print(f"  FAILED {name} M={m}: rel err {f['rel_err']:.3g} with {f['launch']}")
    return {"shape": name, "n": n, "k": k, "m": m, "bf16_us": bf16_us, "w8a8_us": layers_us, "quantize_us": quant_us,
            "timed": timed, "failed": failed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="256,2048,8192")
    p.add_argument("--full", action="store_true", help="every launch combination (about five times longer)")
    p.add_argument("--json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = [bench_shape(name, n, k, m, sms, args.full)
               for m in (int(v) for v in args.m.split(",")) for name, (n, k) in SHAPES.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
