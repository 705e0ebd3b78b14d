"""Which attention backend is faster, per phase, on this GPU: nv's Triton kernels against FlashAttention-4.

Qwen3-0.6B attention shape (16 query heads, 8 KV heads, head_dim 128, bf16), paged KV cache with random
block tables, caches far larger than L2. Phases as the engine runs them:
- prefill (eager in the engine): varlen causal prefill over the paged cache (fresh prompts and chunks
  over a cached prefix), timed as back-to-back eager calls between CUDA events (Python overhead counts);
- decode (CUDA graphs in the engine): batch 1 / 64 / 256 x context 1k / 2k / 4k, timed as replays of a
  captured graph of several calls between CUDA events.
Each backend runs at each block size of --block-sizes (FA4 loads whole pages by TMA when the block size
equals its key tile, 128 at head_dim 128, and gathers rows otherwise). First, in this fresh process, the
start-up cost FA4 adds: importing flash_attn.cute and compiling its kernels (FlashAttn4Backend.warm_up).
Prints a markdown table, the winner per phase at the engine's block size (the entries for
nv_kernels.registry.FASTEST_ON_CUDA), and JSON (--json FILE).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/attention_backend_sweep.py --json sweep.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import time
from collections.abc import Callable

import torch

HQ, HKV, D, DTYPE = 16, 8, 128, torch.bfloat16  # Qwen3-0.6B
SCALE = D ** -0.5
PREFILL_WORKLOADS = [  # (sequences, new tokens each, cached prefix each)
    (8, 2048, 0), (1, 8192, 0), (4, 512, 3584), (64, 128, 0),
]
DECODE_BATCHES = (1, 64, 256)
DECODE_CONTEXTS = (1024, 2048, 4096)


def measure_fa4_start_cost(block_sizes: list[int]) -> tuple[object, dict]:
    """A FlashAttn4Backend and the seconds it took to import flash_attn.cute and to compile the variants
    the engine uses, per block size (cold: the first FA4 work of this process;
    FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 keeps compiled kernels on disk across processes)."""
    from nv_kernels.flash_attn4_backend import FlashAttn4Backend  # imports Triton, not FA4

    start = time.perf_counter()
    backend = FlashAttn4Backend()  # imports flash_attn.cute
    cost: dict = {"import_s": time.perf_counter() - start, "warm_up_s": {}}
    for bs in block_sizes:
        cache = torch.zeros(4, bs, HKV, D, dtype=DTYPE, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        backend.warm_up(HQ, cache, cache)
        torch.cuda.synchronize()
        cost["warm_up_s"][bs] = time.perf_counter() - start
    return backend, cost


def eager_ms(fn: Callable[[], object], calls: int = 20, rounds: int = 5) -> float:
    """Median per-call time of `calls` back-to-back eager calls (launch overhead included)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def graph_ms(fn: Callable[[], object], calls_per_graph: int = 10, replays: int = 20) -> float:
    """Median per-call time of a CUDA graph of `calls_per_graph` calls (kernel time, no launch overhead)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls_per_graph)
    return statistics.median(times)


def paged_cache(num_seqs: int, context: int, block_size: int, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = -(-context // block_size)
    num_blocks = num_seqs * per_seq + 1
    shape = (num_blocks, block_size, HKV, D)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    tables = torch.randperm(num_blocks, device="cuda", generator=gen)[:num_seqs * per_seq]
    return dict(k_cache=k_cache, v_cache=v_cache, gen=gen,
                block_tables=tables.to(torch.int32).view(num_seqs, per_seq),
                seq_lens=torch.full((num_seqs,), context, dtype=torch.int32, device="cuda"))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def prefill_call(backend, q: torch.Tensor, inp: dict, cu: torch.Tensor, q_len: int,
                 context: int) -> Callable[[], torch.Tensor]:
    return lambda: backend.prefill(q, inp["k_cache"], inp["v_cache"], cu_seqlens_q=cu, seq_lens=inp["seq_lens"],
                                   block_tables=inp["block_tables"], max_seqlen_q=q_len, max_seqlen_k=context,
                                   scale=SCALE)


def decode_call(backend, q: torch.Tensor, inp: dict) -> Callable[[], torch.Tensor]:
    # max_seqlen_k: the engine's graphs pass max_model_len (4096 in nv bench)
    return lambda: backend.decode(q, inp["k_cache"], inp["v_cache"], seq_lens=inp["seq_lens"],
                                  block_tables=inp["block_tables"], max_seqlen_k=4096, scale=SCALE)


def sweep(backends: dict, block_sizes: list[int], results: list[dict]) -> None:
    for num_seqs, q_len, prefix in PREFILL_WORKLOADS:
        label = f"prefill {num_seqs}x{q_len}" + (f" over {prefix} cached" if prefix else "")
        context = q_len + prefix
        flops = num_seqs * 4 * HQ * D * q_len * (prefix + (q_len + 1) / 2)  # causal QK^T and PV
        for bs in block_sizes:
            inp = paged_cache(num_seqs, context, bs, seed=1)
            q = torch.randn(num_seqs * q_len, HQ, D, device="cuda", dtype=DTYPE, generator=inp["gen"])
            cu = torch.arange(num_seqs + 1, device="cuda", dtype=torch.int32) * q_len
            outs: dict[str, torch.Tensor] = {}
            for name, backend in backends.items():
                record(results, "prefill", label, name, bs, eager_ms, outs,
                       prefill_call(backend, q, inp, cu, q_len, context), tflops=flops)
            del inp
    for batch in DECODE_BATCHES:
        for context in DECODE_CONTEXTS:
            label = f"decode B={batch} ctx={context}"
            kv_bytes = 2 * batch * context * HKV * D * DTYPE.itemsize
            for bs in block_sizes:
                inp = paged_cache(batch, context, bs, seed=2)
                q = torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE, generator=inp["gen"])
                outs = {}
                for name, backend in backends.items():
                    record(results, "decode", label, name, bs, graph_ms, outs, decode_call(backend, q, inp),
                           kv_bytes=kv_bytes)
                del inp


def record(results: list[dict], phase: str, label: str, name: str, bs: int,
           timer: Callable[[Callable[[], object]], float], outs: dict[str, torch.Tensor],
           call: Callable[[], torch.Tensor], tflops: float = 0.0, kv_bytes: int = 0) -> None:
    row: dict = dict(phase=phase, workload=label, backend=name, block_size=bs)
    try:
        outs[name] = call()
        if "triton" in outs and name != "triton":
            row["rel_err_vs_triton"] = relative_error(outs[name], outs["triton"])
        row["ms"] = timer(call)
        if tflops:
            row["tflops"] = tflops / (row["ms"] * 1e-3) / 1e12
        if kv_bytes:
            row["kv_tb_per_s"] = kv_bytes / (row["ms"] * 1e-3) / 1e12
    except Exception as exc:  # a variant that does not compile or run here: recorded, the sweep goes on
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    results.append(row)
    shown = f"{row['ms'] * 1e3:9.1f} us" if "ms" in row else row["error"]
    print(f"{label:34s} {name:10s} BS={bs:4d} {shown}", flush=True)


def markdown(results: list[dict], columns: list[tuple[str, int]]) -> str:
    head = "| workload | " + " | ".join(f"{n} bs{bs} (us)" for n, bs in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 1)]
    for label in dict.fromkeys(r["workload"] for r in results):
        cells = []
        for name, bs in columns:
            row = next((r for r in results if r["workload"] == label and r["backend"] == name
                        and r["block_size"] == bs), None)
            cells.append(f"{row['ms'] * 1e3:.1f}" if row and "ms" in row else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def winners(results: list[dict], block_size: int) -> dict[str, list[str]]:
    """Per phase, backends by the geometric mean of their time over that phase's workloads, fastest first
    (only backends that ran every workload of the phase)."""
    table: dict[str, list[str]] = {}
    for phase in ("prefill", "decode"):
        rows = [r for r in results if r["phase"] == phase and r["block_size"] == block_size]
        workloads = {r["workload"] for r in rows}
        scores = {}
        for name in {r["backend"] for r in rows}:
            times = [r["ms"] for r in rows if r["backend"] == name and "ms" in r]
            if len(times) == len(workloads):
                scores[name] = math.exp(sum(math.log(t) for t in times) / len(times))
        table[phase] = sorted(scores, key=scores.__getitem__)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-sizes", default="64,128", help="KV block sizes to run every backend at")
    parser.add_argument("--engine-block-size", type=int, default=64, help="the block size the winners are for")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    header = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name(0),
                  capability=list(torch.cuda.get_device_capability()), torch=torch.__version__)
    print(header, flush=True)
    from nv_kernels.triton_backend import TritonBackend

    backends: dict = {"triton": TritonBackend()}
    start_cost: dict = {}
    try:
        backends["flash_attn"], start_cost = measure_fa4_start_cost(sorted({*block_sizes, args.engine_block_size}))
        print(f"FA4 start-up cost: import flash_attn.cute {start_cost['import_s']:.1f} s; compile "
              + ", ".join(f"block size {bs}: {s:.1f} s" for bs, s in start_cost["warm_up_s"].items()), flush=True)
    except Exception as exc:
        start_cost = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"FlashAttention-4 does not run here ({start_cost['error']}): Triton only", flush=True)
    for name, backend in backends.items():  # the Triton compiles too, before anything is timed
        cache = torch.zeros(4, block_sizes[0], HKV, D, dtype=DTYPE, device="cuda")
        backend.decode(torch.zeros(1, HQ, D, dtype=DTYPE, device="cuda"), cache, cache,
                       seq_lens=torch.ones(1, dtype=torch.int32, device="cuda"),
                       block_tables=torch.zeros(1, 1, dtype=torch.int32, device="cuda"), max_seqlen_k=1, scale=SCALE)
        print(f"{name}: ready", flush=True)
    results: list[dict] = []
    sweep(backends, block_sizes, results)
    columns = [(name, bs) for name in backends for bs in block_sizes]
    print("\n" + markdown(results, columns) + "\n")
    best = winners(results, args.engine_block_size)
    print(f"fastest first at block size {args.engine_block_size} (FASTEST_ON_CUDA in nv_kernels/registry.py):")
    print("FASTEST_ON_CUDA = {" + ", ".join(f'"{p}": {tuple(n)!r}' for p, n in best.items()) + "}")
    errors = [r for r in results if "error" in r]
    if errors:
        print(f"{len(errors)} runs failed (see 'error' in the JSON)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header, fa4_start_cost=start_cost, winners=best, results=results), f, indent=1)


if __name__ == "__main__":
    main()
