"""Decode-step profile and throughput sweeps (run on a CUDA GPU).

  python3 benchmarks/perf_sweep.py --out DIR [--model DIR] [--skip-profile] [--skip-sweep] [--graph-profile]
                                   [--prefill-profile] [--kv-cache-dtype auto|fp8|fp8_e5m2]

1. Profile: 256 sequences of 1,024 prompt tokens, all in decode; one decode step's kernels from
   torch.profiler (eager, so kernels have names), as a markdown table (kernel, time, share), plus the
   wall time per decode step with CUDA graphs and the CPU time the engine spends outside `execute`.
2. Sweeps: decode output tok/s against the number of concurrent sequences (1, 16, 64, 256, 512) at
   context 1,024, and against the context length (256 .. 4,096) at 64 sequences; beside each, the
   floor from bytes (weights + KV of each sequence's context per step, over the copy bandwidth
   measured in the same process). Writes sweep.json, sweep.md and sweep.png.
3. --prefill-profile: one step that prefills 16 prompts of 1,024 tokens (16,384 tokens: the step budget, as the
   headline's first steps), its kernels from torch.profiler (prefill_profile.md).
--kv-cache-dtype: every engine above with this KV cache (an FP8 cache halves the floor's KV bytes); the files of
a non-default cache carry its name (profile-fp8.md ...), so one DIR holds both.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from nv_engine.config.engine_config import KV_CACHE_DTYPES
from nv_engine.entrypoints.bench.throughput import checkpoint_weight_bytes, copy_bandwidth, kv_bytes_per_token
from nv_engine.entrypoints.llm import LLM
from nv_engine.sampling_params import SamplingParams


def fill_decode(engine, batch: int, ctx: int, max_tokens: int, tag: str) -> list[str]:
    """Add `batch` requests of `ctx` prompt tokens and step until every one is decoding."""
    ids = []
    for i in range(batch):
        rid = f"{tag}-{i}"
        prompt = [(7 * i + 13 * j) % 10000 + 1 for j in range(ctx)]   # distinct: no prefix hits
        engine.add_request(rid, {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=max_tokens))
        ids.append(rid)
    while engine.scheduler.num_waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
        engine.step()
    engine.step()
    return ids


def timed_decode(engine, steps: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def profile_decode_kernels(engine, batch: int, ctx: int, warmup: int, steps: int) -> dict[str, tuple[float, float]]:
    """`batch` sequences of `ctx` prompt tokens in decode; `steps` steps under torch.profiler. Returns kernel name ->
    (GPU us per step, launches per step)."""
    ids = fill_decode(engine, batch, ctx, warmup + steps + 10, "prof")
    for _ in range(warmup):
        engine.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    engine.abort_request(ids)
    return kernel_rows(prof, steps)


def kernel_rows(prof, steps: int) -> dict[str, tuple[float, float]]:
    """A profile's CUDA kernels: name -> (GPU us per step, launches per step) over `steps` steps."""
    rows: dict[str, tuple[float, float]] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            us, count = rows.get(ev.key, (0.0, 0.0))
            rows[ev.key] = (us + t / steps, count + ev.count / steps)
    return rows


def kernel_table(kernels: dict[str, tuple[float, float]]) -> str:
    """Markdown: the 25 kernels with the most GPU time per step, their launches per step and share."""
    total = sum(us for us, _ in kernels.values())
    lines = ["| kernel | time per step (us) | launches per step | share |", "|---|---|---|---|"]
    for name, (t, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]:
        lines.append(f"| `{name[:90]}` | {t:.1f} | {count:.0f} | {t / total:.1%} |")
    lines.append(f"| **total GPU time** | {total:.1f} | {sum(c for _, c in kernels.values()):.0f} | 100% |")
    return "\n".join(lines)


def profile_step(llm_eager, path: Path) -> str:
    table = kernel_table(profile_decode_kernels(llm_eager.llm_engine, 256, 1024, warmup=3, steps=5))
    path.write_text(table + "\n")
    return table


def prefill_step_profile(llm, path: Path, num_prompts: int = 16, prompt_len: int = 1024) -> str:
    """The kernels of one engine step that prefills `num_prompts` prompts of `prompt_len` tokens (one step when they
    fit the step budget; one output token each, so no decode step follows); the same step on other prompts first
    compiles its kernels."""
    engine = llm.llm_engine
    for tag in ("prefill-warm", "prefill-prof"):
        ids = []
        for i in range(num_prompts):
            prompt = [(11 * i + 17 * j + len(tag)) % 10000 + 1 for j in range(prompt_len)]   # distinct: no hits
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt},
                               SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=1))
            ids.append(f"{tag}-{i}")
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
        engine.abort_request(ids)
    table = f"prefill step, {num_prompts} x {prompt_len} tokens\n" + kernel_table(kernel_rows(prof, 1))
    path.write_text(table + "\n")
    return table


def graph_step_profile(llm, path: Path, trace: Path) -> str:
    """Steady-state decode at batch 256 with CUDA graphs: wall ms per step, GPU busy ms per step,
    and the host-side ops that take the most CPU time (what the GPU may wait for)."""
    engine = llm.llm_engine
    ids = fill_decode(engine, 256, 1024, 200, "gprof")
    for _ in range(5):
        engine.step()
    steps = 50
    wall = timed_decode(engine, steps) / steps
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(10):
            engine.step()
        torch.cuda.synchronize()
    engine.abort_request(ids)
    prof.export_chrome_trace(str(trace))
    gpu = sum(e.device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA) / 10
    cpu_rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]
    lines = [f"graph decode, batch 256, ctx ~1024: wall {wall * 1e3:.3f} ms/step, GPU kernels {gpu / 1e3:.3f} ms/step",
             "| host op | self CPU us per step | calls per step |", "|---|---|---|"]
    for e in cpu_rows:
        lines.append(f"| `{e.key[:80]}` | {e.self_cpu_time_total / 10:.1f} | {e.count / 10:.1f} |")
    text = "\n".join(lines)
    path.write_text(text + "\n")
    return text


def sweep(llm, bandwidth: float, weight_bytes: int, kv_per_token: int) -> list[dict]:
    engine = llm.llm_engine
    points = [("batch", b, 1024) for b in (1, 16, 64, 256, 512)] + \
             [("context", 64, c) for c in (256, 512, 1024, 2048, 4096 - 128)]
    results = []
    steps = 64
    for kind, batch, ctx in points:
        ids = fill_decode(engine, batch, ctx, steps + 40, f"{kind}-{batch}-{ctx}")
        seconds = timed_decode(engine, steps)
        engine.abort_request(ids)
        mean_ctx = ctx + 1 + steps / 2
        floor_step = (weight_bytes + batch * mean_ctx * kv_per_token) / bandwidth
        r = dict(kind=kind, batch=batch, context=ctx, tok_s=batch * steps / seconds,
                 floor_tok_s=batch / floor_step, step_ms=1e3 * seconds / steps)
        r["floor_ratio"] = r["tok_s"] / r["floor_tok_s"]
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def plot(results: list[dict], path: Path, kv_cache_dtype: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind, x, label in ((axes[0], "batch", "batch", "concurrent sequences (context 1,024)"),
                               (axes[1], "context", "context", "context length (64 sequences)")):
        rs = [r for r in results if r["kind"] == kind]
        xs = [r[x] for r in rs]
        ax.plot(xs, [r["tok_s"] for r in rs], "o-", label="nv")
        ax.plot(xs, [r["floor_tok_s"] for r in rs], "k--", label="floor (bytes / copy bandwidth)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_ylabel("decode output tok/s")
        ax.grid(True, alpha=0.3)
        ax.legend()
    kv = "" if kv_cache_dtype == "auto" else f", {kv_cache_dtype} KV cache"
    fig.suptitle(f"nv decode throughput, Qwen3-0.6B shape, bf16{kv}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def output_path(out: Path, name: str, kv_cache_dtype: str) -> Path:
    """out/name, with the KV cache dtype before the suffix unless it is the default ("auto")."""
    path = out / name
    return path if kv_cache_dtype == "auto" else path.with_name(f"{path.stem}-{kv_cache_dtype}{path.suffix}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", default=".")
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--graph-profile", action="store_true")
    p.add_argument("--prefill-profile", action="store_true")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    return p


def main() -> None:
    args = build_parser().parse_args()
    out, kv = Path(args.out), args.kv_cache_dtype
    out.mkdir(parents=True, exist_ok=True)
    engine_args = dict(max_model_len=4096, kv_cache_dtype=kv)
    if not args.skip_profile:
        llm = LLM(args.model, max_num_seqs=256, gpu_memory_utilization=0.5, enforce_eager=True, **engine_args)
        print(profile_step(llm, output_path(out, "profile.md", kv)), flush=True)
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()
    if args.graph_profile or args.prefill_profile:
        llm = LLM(args.model, max_num_seqs=256, gpu_memory_utilization=0.5, **engine_args)
        if args.graph_profile:
            print(graph_step_profile(llm, output_path(out, "graph_profile.md", kv),
                                     output_path(out, "graph_trace.json", kv)), flush=True)
        if args.prefill_profile:
            print(prefill_step_profile(llm, output_path(out, "prefill_profile.md", kv)), flush=True)
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()
    if not args.skip_sweep:
        llm = LLM(args.model, max_num_seqs=512, gpu_memory_utilization=0.9, **engine_args)
        hf = llm.config.hf_config
        itemsize = torch.empty(0, dtype=llm.config.dtype).element_size()
        kv_per_token = kv_bytes_per_token(hf, llm.config.kv_dtype)   # the floor reads the cache's bytes
        bandwidth = copy_bandwidth(torch.device("cuda:0"))
        weight_bytes = checkpoint_weight_bytes(llm.config.model, itemsize, llm.config.quantization)
        results = sweep(llm, bandwidth, weight_bytes, kv_per_token)
        output_path(out, "sweep.json", kv).write_text(json.dumps(results, indent=2))
        lines = ["| sweep | sequences | context | nv tok/s | floor tok/s | ratio | ms/step |",
                 "|---|---|---|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r['kind']} | {r['batch']} | {r['context']} | {r['tok_s']:.0f} | "
                         f"{r['floor_tok_s']:.0f} | {r['floor_ratio']:.1%} | {r['step_ms']:.2f} |")
        output_path(out, "sweep.md", kv).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        plot(results, output_path(out, "sweep.png", kv), kv)
        llm.shutdown()


if __name__ == "__main__":
    main()
