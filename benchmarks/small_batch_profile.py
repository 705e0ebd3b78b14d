"""Small-batch decode: milliseconds per token at batch 1, the share of the floor at batch 16 and 64, and a
profile of one batch-1 decode step (kernels per step, time per kernel class). Run on a CUDA GPU.

    python3 benchmarks/small_batch_profile.py [SHAPE] [--out DIR] [--no-profile] [--batches 16,64] [--host-profile]
        [--quantization fp8|awq]

SHAPE: qwen3-0.6b (default) or qwen3-8b (random bf16 weights of that shape, cached). --quantization fp8 / awq: the
same checkpoint with its linear layers quantized when loaded, to block-wise FP8 or to INT4 in groups of 128 (round
to nearest, AWQ's layout); the floors then count the weights as the runtime stores them, and batch 1's line also
gives the bf16 weights' floor.
- batch 1: a 512-token prompt, then 512 decode steps with CUDA graphs, twice; ms per token is the mean step time
  of the first round ("value"), and each round also gives its median and longest step; then 50 steps under
  torch.profiler give the device's busy time per step against the period (a host-bound step shows idle time);
  --host-profile: then 10 steps under cProfile (the host's time per step and where it goes), and 10 under
  torch.profiler's host activity (the CUDA runtime calls per step: a launch that waits for the device shows long).
- batch 16 / 64: perf_sweep's definition (context 1,024, 64 timed steps; floor = weights + KV bytes read per
  step over the copy bandwidth measured in the same process).
- profile: 20 batch-1 steps under torch.profiler with CUDA graphs (kernels inside the graph are traced);
  kernels are grouped by class from their names. Prints one JSON line per measure and writes profile.md.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
import time
from collections import defaultdict
from pathlib import Path

import torch
from perf_sweep import fill_decode, profile_decode_kernels, timed_decode

from nv_engine.entrypoints.bench.throughput import copy_bandwidth
from nv_engine.entrypoints.llm import LLM
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

try:
    from nv_engine.entrypoints.bench.throughput import checkpoint_weight_bytes
except ImportError:   # trees before quantized floors: bf16 weights' bytes whatever the quantization
    from nv_engine.entrypoints.bench.throughput import checkpoint_parameters

    def checkpoint_weight_bytes(model_dir: str, itemsize: int, quantization: str | None = None) -> int:
        return checkpoint_parameters(model_dir) * itemsize

# kernel class by the first pattern its (lower-cased) name matches
KERNEL_CLASSES = [
    ("gemm", r"gemm|gemv|cutlass|sm90_xmma|nvjet|matmul|splitk|ampere_bf16|cublas"),
    ("attention", r"attn|attention|decode_kernel|paged|flash"),
    ("norm", r"norm"),
    ("rope / kv store", r"rope|rotary|store|cache"),
    ("activation", r"silu|act_and_mul|gelu"),
    ("sampler", r"sampl|argmax|topk|top_k|softmax|gumbel|exponential|philox|random"),
    ("elementwise / copy", r"elementwise|vectorized|copy|fill|add|mul|index|cat|reduce"),
]


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, pattern in KERNEL_CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


def batch_one_ms(engine, prompt_len: int, steps: int, host_profile: bool = False) -> dict:
    """Batch 1: a prompt_len-token prompt, then `steps` timed decode steps, twice (the first round right after the
    engine's start, then a second). ms per token = mean step time; each step's wall time is also kept, so a
    stall inside a round (a compile, a collection) shows as a median far under the mean and a large max."""
    busy_steps = 50
    ids = fill_decode(engine, 1, prompt_len, 2 * steps + busy_steps + 40, "b1")   # outlives every step below
    for _ in range(5):
        engine.step()
    rounds = []
    for _ in range(2):
        torch.cuda.synchronize()
        marks = [time.perf_counter()]
        for _ in range(steps):
            engine.step()
            marks.append(time.perf_counter())
        torch.cuda.synchronize()
        total = time.perf_counter() - marks[0]
        per_step = sorted(b - a for a, b in zip(marks[:-1], marks[1:], strict=True))
        rounds.append({"ms_per_token": round(1e3 * total / steps, 4),
                       "median_step_ms": round(1e3 * per_step[len(per_step) // 2], 4),
                       "max_step_ms": round(1e3 * per_step[-1], 3)})
    result = {"value": rounds[0]["ms_per_token"], "rounds": rounds, **gpu_busy(engine, busy_steps)}
    if host_profile:
        result["host"] = host_profile_steps(engine, 10)
        result["host_api"] = host_api_calls(engine, 10)
    engine.abort_request(ids)
    return result


def gpu_busy(engine, steps: int) -> dict:
    """`steps` more batch-1 steps under torch.profiler (device activity only): per step, the wall time from the
    first kernel's start to the last one's end over the window, and the time some kernel or copy ran (the union
    of their intervals). busy well under the period: the device waited for the host between kernels."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    spans = sorted((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                   if ev.device_type == torch.autograd.DeviceType.CUDA and ev.time_range.end > ev.time_range.start)
    if not spans:
        return {}
    covered, (lo, hi) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > hi:
            covered, lo = covered + hi - lo, start
        hi = max(hi, end)
    covered += hi - lo
    window = max(end for _, end in spans) - spans[0][0]
    return {"profiled_period_us": round(window / steps, 1), "profiled_busy_us": round(covered / steps, 1)}


def host_profile_steps(engine, steps: int, top: int = 12) -> dict:
    """`steps` more batch-1 steps under cProfile (which slows the host): the host's time per step, the functions
    that spend the most of it themselves and those that spend the most with their callees (us per step)."""
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler).stats   # (file, line, name) -> (calls, .., own seconds, with callees, ..)

    def top_by(column: int) -> dict[str, float]:
        rows = sorted(stats.items(), key=lambda kv: -kv[1][column])[:top]
        return {f"{Path(f).name}:{line} {name}": round(1e6 * v[column] / steps, 1) for (f, line, name), v in rows}

    return {"us_per_step": round(1e6 * wall / steps, 1), "top_self_us_per_step": top_by(2),
            "top_cumulative_us_per_step": top_by(3)}


def host_api_calls(engine, steps: int, top: int = 10) -> dict:
    """`steps` more batch-1 steps under torch.profiler with the host's activity: per step, the CUDA runtime / driver
    calls by name (count, total and longest us). A launch call far longer than its usual few us waited for the device
    (a full launch queue, or a graph whose previous launch had not finished)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])   # name -> count, total us, max us
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CPU and re.match(r"cu[A-Z]|cuda[A-Z]", ev.name):
            duration = ev.time_range.end - ev.time_range.start
            entry = calls[ev.name]
            entry[0] += 1
            entry[1] += duration
            entry[2] = max(entry[2], duration)
    rows = sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]
    return {name: {"per_step": round(n / steps, 1), "us_per_step": round(total / steps, 1), "max_us": round(longest, 1)}
            for name, (n, total, longest) in rows}


def profile_batch_one(engine, out: Path) -> dict:
    per_kernel = profile_decode_kernels(engine, 1, 512, warmup=5, steps=20)
    classes: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, (t, n) in per_kernel.items():
        classes[kernel_class(name)][0] += t
        classes[kernel_class(name)][1] += n
    total_t = sum(t for t, _ in classes.values())
    total_n = sum(n for _, n in classes.values())
    lines = ["| kernel class | kernels per step | GPU time per step (us) | share |", "|---|---|---|---|"]
    for cls, (t, n) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {cls} | {n:.0f} | {t:.1f} | {t / total_t:.1%} |")
    lines.append(f"| **all** | {total_n:.0f} | {total_t:.1f} | 100% |")
    lines += ["", "| kernel | per step | us per step | us per call |", "|---|---|---|---|"]
    for name, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:30]:
        lines.append(f"| `{name[:90]}` | {n:.0f} | {t:.1f} | {t / max(n, 1e-9):.2f} |")
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return {"kernels_per_step": total_n, "gpu_us_per_step": total_t,
            "classes": {c: {"kernels": n, "us": t} for c, (t, n) in classes.items()}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-0.6b")
    p.add_argument("--out", default=".")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--host-profile", action="store_true", help="also 10 batch-1 steps under cProfile")
    p.add_argument("--quantization", choices=["fp8", "awq"], help="quantize the linear layers when loading")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(nv_cache_dir() / f"bench-random-{args.shape}-bf16")
    if not (Path(model) / "model.safetensors").exists() and not list(Path(model).glob("*.safetensors")):
        try:
            write_random_checkpoint(model, args.shape, dtype="bfloat16", device="cuda")   # drawn on the GPU: seconds
        except TypeError:   # trees whose writer draws on the CPU only
            write_random_checkpoint(model, args.shape, dtype="bfloat16")
    started = time.perf_counter()
    llm = LLM(model, max_model_len=4096, max_num_seqs=256, gpu_memory_utilization=0.6, quantization=args.quantization)
    start_s = time.perf_counter() - started
    engine = llm.llm_engine
    batch_one = batch_one_ms(engine, 512, 512, args.host_profile)
    print(json.dumps({"shape": args.shape, "quantization": args.quantization, "measure": "batch1_ms_per_token",
                      **batch_one,
                      "start_s": round(start_s, 1)}), flush=True)
    hf = llm.config.hf_config
    itemsize = torch.empty(0, dtype=llm.config.dtype).element_size()
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    kv_per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * itemsize
    bandwidth = copy_bandwidth(torch.device("cuda:0"))
    weight_bytes = checkpoint_weight_bytes(model, itemsize, args.quantization)
    bf16_bytes = checkpoint_weight_bytes(model, 2)
    print(json.dumps({"measure": "batch1_floor_ms", "value": round(1e3 * weight_bytes / bandwidth, 4),
                      "bf16_weights_ms": round(1e3 * bf16_bytes / bandwidth, 4),
                      "copy_bw_GBs": round(bandwidth / 1e9)}), flush=True)
    for batch in [int(b) for b in args.batches.split(",") if b]:
        steps, ctx = 64, 1024
        ids = fill_decode(engine, batch, ctx, steps + 40, f"b{batch}")
        seconds = timed_decode(engine, steps)
        engine.abort_request(ids)
        floor_step = (weight_bytes + batch * (ctx + 1 + steps / 2) * kv_per_token) / bandwidth
        tok_s = batch * steps / seconds
        print(json.dumps({"measure": f"batch{batch}_floor_share", "value": round(tok_s / (batch / floor_step), 4),
                          "tok_s": round(tok_s), "step_ms": round(1e3 * seconds / steps, 4)}), flush=True)
    if not args.no_profile:
        print(json.dumps({"measure": "profile", **profile_batch_one(engine, out)}), flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main()
