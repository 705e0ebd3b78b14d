"""The skinny GEMM (nv_kernels.skinny_gemm) against torch at decode batch sizes (GPU only).

For the four projections of the Qwen3-0.6B and Qwen3-8B shapes (qkv, o, gate_up with SiLU-and-mul, down)
and M in {1, 2, 4, 8, 16}: checks every configuration of a small sweep against torch in fp32 (fresh random
inputs at the real shape), then times torch's F.linear, today's unfused path (F.linear, and for gate_up the
SiLU-and-mul kernel after it) and each configuration. Each timing is a CUDA graph of calls that rotate
through enough copies of the weight (and of x) that every call reads its weight from HBM, not from the
50 MB L2 of an H200; microseconds per call are the median over graph replays. Prints per shape: torch us,
best skinny us and its configuration, the weight's GB/s, the speedup; writes JSON, and with --table the
winners as `TUNED_CONFIGS` entries to paste into nv_kernels/skinny_gemm_config.py.
--fp8: the same projections with block-FP8 weights: per projection and M, the bf16 skinny GEMM (bf16 weights, the
layers' configuration) against the FP8 skinny GEMM (the layers' configuration and the fastest of a sweep) and the
W8A8 block GEMM, in us and GB/s of the weight read (FP8: codes and scales); an M over 16 (--m 256) times torch's
bf16 GEMM against the W8A8 block GEMM alone (the large-batch path); --table then prints
`FP8_TUNED_CONFIGS` entries for nv_kernels/fp8_skinny_gemm_config.py.
The projections after a norm (qkv, gate_up) are also timed with the add + RMSNorm: the unfused pair (the
fused_norm kernel, then the faster of torch and the best skinny configuration) against `skinny_norm_gemm`
with the configuration the layers choose and with the three fastest plain configurations.

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/bench_small_gemm.py [--json out.json]
        [--table] [--models 0.6b,8b] [--m 1,2,4,8,16] [--full] [--fp8 [--quick]]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from nv_kernels.fp8_block_gemm import fp8_block_gemm_triton, quantize_fp8_block
from nv_kernels.fp8_skinny_gemm import fp8_skinny_gemm, fp8_skinny_gemm_torch
from nv_kernels.fp8_skinny_gemm_config import choose_fp8_config, fit_to_scale_blocks, weight_first_config
from nv_kernels.fused_act import silu_and_mul_triton
from nv_kernels.fused_norm import rms_norm_triton
from nv_kernels.skinny_gemm import (
    MAX_M,
    skinny_gemm,
    skinny_gemm_torch,
    skinny_norm_gemm,
    skinny_norm_gemm_torch,
)
from nv_kernels.skinny_gemm_config import SkinnyGemmConfig, choose_config, heuristic_config
from nv_kernels.testing import relative_error

DTYPE = torch.bfloat16
L2_BYTES = 50 << 20            # H200; the weights a graph reads add up to at least twice this
MAX_COPIES = 32
TOLERANCE = {False: 8e-3, True: 2e-2}   # relative error against fp32 torch: plain, gated
# (weight rows N_w, K, gated) per projection
SHAPES = {
    "0.6b": {"qkv": (4096, 1024, False), "o": (1024, 2048, False), "gate_up": (6144, 1024, True),
             "down": (1024, 3072, False)},
    "8b": {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (24576, 4096, True),
           "down": (4096, 12288, False)},
}
AFTER_NORM = ("qkv", "gate_up")   # the projections whose add + RMSNorm the layers fuse into the GEMM
EPS = 1e-6


def sweep(rows: int, k: int, m: int, gated: bool, full: bool) -> list[SkinnyGemmConfig]:
    """The heuristic's configuration first, then a small grid around it (--full: a wider one)."""
    base = heuristic_config(rows, k, m, gated, torch.cuda.get_device_properties(0).multi_processor_count)
    block_ns = (16, 32, 64) if full else (16, 32)
    block_ks = (64, 128, 256, 512) if full else (128, 256, 512)
    splits = sorted({max(1, base.split_k // 2), base.split_k, 2 * base.split_k})
    dots = (True, False) if m <= 2 else (True,)
    warps = (4, 8) if full else (4,)
    stages = (base.num_stages,)
    configs = [base, SkinnyGemmConfig(**{**base.__dict__, "num_warps": 8})]
    for bn, bk, sk, dot, nw, ns in itertools.product(block_ns, block_ks, splits, dots, warps, stages):
        if k // sk < bk:
            continue
        cfg = SkinnyGemmConfig(block_n=bn, block_k=bk, split_k=sk, num_warps=nw, num_stages=ns, use_dot=dot)
        if cfg not in configs:
            configs.append(cfg)
    return configs


def graph_us(fns: list[Callable[[], object]], replays: int = 20) -> float:
    """Median microseconds per call of fns run back to back in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()                                          # compile / warm up off the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    del graph
    return statistics.median(times)


def bench_shape(name: str, rows: int, k: int, gated: bool, m: int, full: bool) -> dict:
    weight_bytes = rows * k * DTYPE.itemsize
    copies = max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / weight_bytes)))
    calls = max(copies, 20)
    gen = torch.Generator(device="cuda").manual_seed(rows + k + m)
    weights = [(torch.randn(rows, k, device="cuda", generator=gen) * k ** -0.5).to(DTYPE) for _ in range(copies)]
    xs = [torch.randn(m, k, device="cuda", generator=gen).to(DTYPE) for _ in range(copies)]
    ref = skinny_gemm_torch(xs[0].float(), weights[0].float(), gated=gated)

    def rotate(call: Callable[[torch.Tensor, torch.Tensor], object]) -> list[Callable[[], object]]:
        return [lambda i=i: call(xs[i % copies], weights[i % copies]) for i in range(calls)]

    torch_us = graph_us(rotate(lambda x, w: F.linear(x, w)))
    today_us = graph_us(rotate(lambda x, w: silu_and_mul_triton(F.linear(x, w)))) if gated else torch_us
    configs = sweep(rows, k, m, gated, full)
    results, failed, skipped = [], [], []
    for cfg in configs:
        try:
            err = relative_error(skinny_gemm(xs[0], weights[0], gated=gated, config=cfg), ref)
        except (OutOfResources, CompilationError) as e:   # e.g. shared memory of deep stages of wide tiles
            skipped.append({"config": cfg.__dict__, "error": str(e).splitlines()[0]})
            continue
        if not err < TOLERANCE[gated]:
            failed.append({"config": cfg.__dict__, "rel_err": err})
            continue
        us = graph_us(rotate(lambda x, w, cfg=cfg: skinny_gemm(x, w, gated=gated, config=cfg)))
        results.append({"config": cfg.__dict__, "us": us, "rel_err": err})
    best = min(results, key=lambda r: r["us"]) if results else None
    heuristic_us = next((r["us"] for r in results if r["config"] == configs[0].__dict__), float("nan"))
    row = {"model_proj": name, "rows": rows, "k": k, "gated": gated, "m": m, "weight_mb": weight_bytes / 1e6,
           "copies": copies, "torch_us": torch_us, "today_us": today_us, "heuristic_us": heuristic_us,
           "best": best, "failed": failed, "skipped": skipped, "all": results}
    if name.split()[-1] in AFTER_NORM and best is not None:
        fastest = [SkinnyGemmConfig(**r["config"]) for r in sorted(results, key=lambda r: r["us"])[:3]]
        row["norm"] = bench_norm_fused(xs, weights, rows, k, gated, m, calls, fastest, min(today_us, best["us"]),
                                       failed)
    if best is not None:
        best_us = best["us"]
        print(f"{name:14s} M={m:<2d} torch {torch_us:7.2f}  today {today_us:7.2f}  skinny {best_us:7.2f} us "
              f"({weight_bytes / best_us / 1e3:6.0f} GB/s, x{today_us / best_us:4.2f})  "
              f"heuristic {heuristic_us:7.2f}  {best['config']}")
    for f in failed:
        print(f"  FAILED {name} M={m}: rel err {f['rel_err']:.3g} with {f['config']}")
    for f in skipped:
        print(f"  skipped {name} M={m}: {f['error']} with {f['config']}")
    return row


def bench_norm_fused(xs: list[torch.Tensor], weights: list[torch.Tensor], rows: int, k: int, gated: bool, m: int,
                     calls: int, configs: list[SkinnyGemmConfig], gemm_us: float, failed: list[dict]) -> dict:
    """us per call of add + RMSNorm + this GEMM: unfused (the norm kernel's time plus gemm_us, the faster
    GEMM's) against `skinny_norm_gemm` with the layers' configuration (None) and with `configs`."""
    copies = len(xs)
    gen = torch.Generator(device="cuda").manual_seed(rows + k + m + 1)
    residuals = [torch.randn(m, k, device="cuda", generator=gen).to(DTYPE) for _ in range(copies)]
    norm_weight = (torch.rand(k, device="cuda", generator=gen) + 0.5).to(DTYPE)
    norm_us = graph_us([lambda i=i: rms_norm_triton(xs[i % copies], norm_weight, EPS, residuals[i % copies])
                        for i in range(calls)])
    ref, _ = skinny_norm_gemm_torch(xs[0].float(), residuals[0].float(), norm_weight.float(), EPS,
                                    weights[0].float(), gated=gated)
    fused: dict[str, float] = {}
    for cfg in [None, *configs]:
        label = str(choose_config(rows, k, m, gated) if cfg is None else cfg)
        out, _ = skinny_norm_gemm(xs[0], residuals[0], norm_weight, EPS, weights[0], gated=gated, config=cfg)
        err = relative_error(out, ref)
        if not err < TOLERANCE[gated]:
            failed.append({"config": label, "rel_err": err, "norm": True})
            continue
        fused[("layers: " if cfg is None else "") + label] = graph_us(
            [lambda i=i, cfg=cfg: skinny_norm_gemm(xs[i % copies], residuals[i % copies], norm_weight, EPS,
                                                   weights[i % copies], gated=gated, config=cfg)
             for i in range(calls)])
    unfused_us = norm_us + gemm_us
    if fused:
        label, us = min(fused.items(), key=lambda kv: kv[1])
        print(f"  + add & RMSNorm: unfused {unfused_us:7.2f} (norm {norm_us:5.2f})  fused {us:7.2f} us  {label}")
    return {"norm_us": norm_us, "unfused_us": unfused_us, "fused_us": fused}


def fp8_sweep(rows: int, k: int, m: int, gated: bool, full: bool, quick: bool = False) -> list[SkinnyGemmConfig]:
    """The FP8 layers' configuration first, then a grid: the CUDA-core GEMV at M = 1 (one K tile per program
    among them), and the tensor cores' weight-first tiles at every M (BLOCK_K 128, one scale block); tiles fitted
    to the scale blocks (fp8_skinny_gemm does the same at launch)."""
    configs = [choose_fp8_config(rows, k, m, gated)]
    if quick:   # the layers' configuration and the tensor cores' weight-first one
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return list(dict.fromkeys([*configs, weight_first_config(rows, k, gated, sms)]))
    n_out = rows // 2 if gated else rows
    widest = min(4096, 1 << (k - 1).bit_length())              # a whole row of K 4096 per program at most
    grid: list[tuple[int, int, int, int, bool]] = []
    if m == 1:
        grid += itertools.product((2, 4, 8, 16, 32) if full else (4, 8, 16), (512, 1024, 2048, widest) if full else
                                  (1024, 2048, widest), (1, 2, 4) if full else (1, 2), (4, 8), (False,))
    grid += itertools.product((64, 128), (128,), (1, 2, 4, 8, 16) if full else (2, 4, 8), (4,), (True,))
    for bn, bk, sk, nw, dot in grid:
        if k // sk < bk or (not dot and bn * bk > 32 * 128 * nw):   # the GEMV: at most 128 fp32 lanes a thread
            continue
        stages = 1 if bk * sk >= k else (2 if not dot else 3)
        cfg = fit_to_scale_blocks(SkinnyGemmConfig(block_n=bn, block_k=bk, split_k=sk, num_warps=nw,
                                                   num_stages=stages, use_dot=dot), n_out, gated)
        if cfg not in configs:
            configs.append(cfg)
    return configs


def bench_fp8_shape(name: str, rows: int, k: int, gated: bool, m: int, full: bool, quick: bool = False) -> dict:
    """One projection with FP8 weights: the bf16 skinny GEMM (the layers' configuration) on bf16 weights, the FP8
    skinny GEMM (the layers' configuration, then fp8_sweep's) and the W8A8 block GEMM on the same weights
    quantized; GB/s = the weight's bytes (FP8: codes and scales) over the time per call."""
    bf16_bytes = rows * k * DTYPE.itemsize
    fp8_bytes = rows * k + math.ceil(rows / 128) * math.ceil(k / 128) * 4
    copies = max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / fp8_bytes)))
    bf16_copies = max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / bf16_bytes)))
    calls = max(copies, 20)
    gen = torch.Generator(device="cuda").manual_seed(rows + k + m)
    weights = [(torch.randn(rows, k, device="cuda", generator=gen) * k ** -0.5).to(DTYPE) for _ in range(copies)]
    quantized = [quantize_fp8_block(w) for w in weights]
    weights = weights[:bf16_copies]
    xs = [torch.randn(m, k, device="cuda", generator=gen).to(DTYPE) for _ in range(copies)]
    ref = fp8_skinny_gemm_torch(xs[0].float(), *quantized[0], gated=gated)

    def gbs(nbytes: int, us: float) -> float:
        return nbytes / us / 1e3

    large = m > MAX_M   # past the skinny GEMMs (prefill, large batches): torch's bf16 GEMM against W8A8
    if large:
        bf16_us = graph_us([lambda i=i: F.linear(xs[i % copies], weights[i % bf16_copies]) for i in range(calls)])
    else:
        bf16_us = graph_us([lambda i=i: skinny_gemm(xs[i % copies], weights[i % bf16_copies], gated=gated)
                            for i in range(calls)])
    block_us = float("nan")
    if not gated or large:   # the block GEMM has no SiLU-and-mul epilogue: gate_up alone only where no skinny runs
        block_us = graph_us([lambda i=i: fp8_block_gemm_triton(xs[i % copies], *quantized[i % copies])
                             for i in range(calls)])
    if large:
        print(f"{name:14s} M={m:<4d} bf16 torch {bf16_us:8.2f} us | W8A8 {block_us:8.2f} us "
              f"(x{bf16_us / block_us:4.2f})")
    results, failed = [], []
    for cfg in [] if large else fp8_sweep(rows, k, m, gated, full, quick):
        try:
            err = relative_error(fp8_skinny_gemm(xs[0], *quantized[0], gated=gated, config=cfg), ref)
        except (OutOfResources, CompilationError):
            continue
        if not err < TOLERANCE[gated]:
            failed.append({"config": cfg.__dict__, "rel_err": err})
            continue
        us = graph_us([lambda i=i, cfg=cfg: fp8_skinny_gemm(xs[i % copies], *quantized[i % copies], gated=gated,
                                                            config=cfg) for i in range(calls)])
        results.append({"config": cfg.__dict__, "us": us, "rel_err": err})
    best = min(results, key=lambda r: r["us"]) if results else None
    layers_us = results[0]["us"] if results and results[0]["config"] == choose_fp8_config(
        rows, k, m, gated).__dict__ else float("nan")
    if best is not None:
        print(f"{name:14s} M={m:<2d} bf16 skinny {bf16_us:7.2f} us {gbs(bf16_bytes, bf16_us):5.0f} GB/s | fp8 "
              f"skinny {layers_us:7.2f} us {gbs(fp8_bytes, layers_us):5.0f} GB/s, best {best['us']:7.2f} us "
              f"{gbs(fp8_bytes, best['us']):5.0f} GB/s (x{bf16_us / best['us']:4.2f}) | W8A8 {block_us:7.2f} us  "
              f"{best['config']}")
    for f in failed:
        print(f"  FAILED {name} M={m}: rel err {f['rel_err']:.3g} with {f['config']}")
    return {"model_proj": name, "rows": rows, "k": k, "gated": gated, "m": m, "bf16_us": bf16_us,
            "fp8_layers_us": layers_us, "w8a8_us": block_us, "fp8_bytes": fp8_bytes, "bf16_bytes": bf16_bytes,
            "best": best, "failed": failed, "all": results}


def table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if r["best"] is None:
            continue
        c = SkinnyGemmConfig(**r["best"]["config"])
        lines.append(f"    ({r['rows']}, {r['k']}, {r['m']}, {r['gated']}): SkinnyGemmConfig("
                     f"block_n={c.block_n}, block_k={c.block_k}, split_k={c.split_k}, num_warps={c.num_warps}, "
                     f"num_stages={c.num_stages}, use_dot={c.use_dot}),   # {r['model_proj']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="bench_small_gemm.json")
    parser.add_argument("--models", default="0.6b,8b")
    parser.add_argument("--m", default="1,2,4,8,16", help="batch sizes (rows of x), each at most 16 but with --fp8")
    parser.add_argument("--full", action="store_true", help="a wider sweep (about four times longer)")
    parser.add_argument("--quick", action="store_true",
                        help="--fp8: time only the layers' configuration and the tensor cores' weight-first one")
    parser.add_argument("--table", action="store_true", help="print the winners as TUNED_CONFIGS entries")
    parser.add_argument("--fp8", action="store_true",
                        help="FP8 weights: bf16 skinny against FP8 skinny (and W8A8) per projection, GB/s")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, {DTYPE}; us per call, weights rotated past L2")
    out = []
    for model in args.models.split(","):
        for proj, (rows, k, gated) in SHAPES[model].items():
            for m in (int(v) for v in args.m.split(",")):
                if args.fp8:
                    out.append(bench_fp8_shape(f"{model} {proj}", rows, k, gated, m, args.full, args.quick))
                else:
                    out.append(bench_shape(f"{model} {proj}", rows, k, gated, m, args.full))
                torch.cuda.empty_cache()                      # the weight copies of the last shape
    failures = sum(len(r["failed"]) for r in out)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": out, "failures": failures}, f, indent=1)
    if args.table:
        print(f"\n{'FP8_' if args.fp8 else ''}TUNED_CONFIGS entries (weight rows, K, M bucket, gated):\n"
              + table(out))
    print(f"\nwrote {args.json}; {failures} configurations failed the correctness check")
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
