"""Micro-benchmark of the nv-kernels Triton kernels on one GPU (Qwen3-0.6B attention shape).

Prints the copy bandwidth (torch copy of a 2 GiB tensor, read + write counted), then paged decode
attention at batch 256 x context 1024 and batch 32 x context 4096 for block sizes 16..256 with a small
config sweep, and the achieved KV bytes/s over the copy bandwidth; then store_kvcache and prefill.
Every KV cache is far larger than the 60 MB L2 and its block table is a random permutation.

    PYTHONPATH=packages/nv-kernels/src python3 benchmarks/bench_decode_attention.py [--quick] [--json out.json]

--rope instead times a decode step's attention at batch 1/16/64 x context 1024, block size 64 (max_seqlen_k
4096, as the engine's graphs): the unfused path (q/k norm + rotary + store kernel, then decode), the fused one
(decode_attention with a DecodeRope) and decode alone, each as --layers calls (28) on distinct caches in one
CUDA graph, in us per layer. Point PYTHONPATH at another checkout's src to compare kernel versions.
--rope --sweep also times the fused decode over splits x tile x warps x stages and prints the fastest five.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import time
from typing import Any

import torch
import triton
from triton.testing import do_bench

from nv_kernels.decode_rope import DecodeRope
from nv_kernels.decode_tuning import choose_num_splits, choose_tile
from nv_kernels.fused_rope import qk_norm_rope_triton
from nv_kernels.triton_decode import _decode_split_kernel as decode_split_kernel  # registers, spills
from nv_kernels.triton_decode import decode_attention
from nv_kernels.triton_prefill import prefill_attention
from nv_kernels.triton_store import store_kvcache

HQ, HKV, D, DTYPE = 16, 8, 128, torch.bfloat16  # Qwen3-0.6B
SCALE = D ** -0.5


def median_ms(fn, rep: int = 60) -> float:
    return float(do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def copy_bandwidth() -> float:
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), rep=200)
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def make_decode_inputs(batch: int, context: int, block_size: int, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = triton.cdiv(context, block_size)
    num_blocks = batch * per_seq
    shape = (num_blocks, block_size, HKV, D)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    return dict(q=torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE, generator=gen),
                k_cache=k_cache, v_cache=v_cache, block_tables=perm.view(batch, per_seq),
                seq_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"))


def decode_bytes(batch: int, context: int) -> int:
    kv = 2 * batch * context * HKV * D * DTYPE.itemsize
    return kv + 2 * batch * HQ * D * DTYPE.itemsize  # + q read and out written


def time_decode(inp: dict, max_len: int, **cfg) -> float:
    return median_ms(lambda: decode_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["seq_lens"],
                                              inp["block_tables"], max_len, SCALE, **cfg))


def bench_decode(batch: int, context: int, block_sizes: list[int], copy_bw: float, results: list[dict],
                 tuned: dict[int, dict], deadline: float) -> None:
    """Default config, a tile/warps/stages sweep (or the config tuned before), then split counts."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nbytes = decode_bytes(batch, context)
    default_splits = choose_num_splits(batch, HKV, 4096, sms)
    for bs in block_sizes:
        inp = make_decode_inputs(batch, context, bs)
        configs = [dict(tile=None, num_warps=None, num_stages=None, num_splits=None)]  # the defaults
        if bs in tuned:
            configs.append(dict(tuned[bs], num_splits=default_splits))
        else:
            grid = [(t, 4, s) for t, s in itertools.product((16, 32, 64), (2, 3, 4))]
            grid += [(32, 8, 3), (64, 8, 3)]
            configs += [dict(tile=t, num_warps=w, num_stages=s, num_splits=default_splits) for t, w, s in grid]
        rows = []
        for i, cfg in enumerate(configs):
            if i > 0 and time.time() > deadline:
                print("  time budget reached: sweep cut short", flush=True)
                break
            try:
                rows.append((time_decode(inp, 4096, **cfg), cfg))
            except Exception as exc:  # a config that does not compile (e.g. out of shared memory)
                print(f"  skip {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
        best = min(rows, key=lambda r: r[0])[1]
        if batch * HKV < 4 * sms:  # small batches: try split counts on the best tile config
            for sp in (1, 2, 4, 8, 16):
                if sp != best["num_splits"] and time.time() < deadline:
                    cfg = dict(best, num_splits=sp)
                    rows.append((time_decode(inp, 4096, **cfg), cfg))
        best_ms, best = min(rows, key=lambda r: r[0])
        tuned.setdefault(bs, {k: best[k] for k in ("tile", "num_warps", "num_stages")})
        for label, ms, cfg in (("default", rows[0][0], rows[0][1]), ("best", best_ms, best)):
            bw = nbytes / (ms * 1e-3)
            results.append(dict(kernel="decode", batch=batch, context=context, block_size=bs, which=label,
                                config=cfg, ms=ms, bytes_per_s=bw, ratio_to_copy=bw / copy_bw,
                                default_tile=choose_tile(bs, D), default_splits=default_splits))
            print(f"decode B={batch:4d} ctx={context:5d} BS={bs:4d} {label:7s} {ms * 1e3:8.1f} us "
                  f"{bw / 1e12:6.3f} TB/s {100 * bw / copy_bw:5.1f}% of copy  {cfg}", flush=True)
        del inp


def graph_us(fn, repeats: int) -> float:
    """fn(i) for i < repeats captured in one CUDA graph; median us per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(0)   # compile off the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(repeats):
            fn(i)
    return 1e3 * median_ms(graph.replay, rep=200) / repeats


def bench_rope(batches: list[int], layers: int, results: list[dict], context: int = 1024, bs: int = 64,
               sweep: bool = False) -> None:
    """Unfused (norm + rotary + store, then decode) vs fused (decode_attention with a DecodeRope) vs decode alone;
    layer i reads its own pages of one pool (no layer finds the previous one's KV in L2)."""
    for batch in batches:
        row = rope_row(batch, layers, context, bs, sweep)
        results.append(row)
        print(f"decode+rope B={batch:3d} ctx={context} BS={bs}: unfused {row['unfused_us']:6.2f} us  fused "
              f"{row['fused_us']:6.2f} us  decode alone {row['decode_alone_us']:6.2f} us  (per layer; x{layers} "
              f"layers = {layers * (row['unfused_us'] - row['fused_us']):.1f} us saved per step)", flush=True)
        print(f"  (registers, spills) of the decode kernel: plain {row['unfused_regs_spills']}  with rope "
              f"{row['fused_regs_spills']}", flush=True)
        if "sweep" in row:
            print(f"  the fused decode's launch today: {row['fused_config']}", flush=True)
        for swept in sorted(row.get("sweep", []), key=lambda r: r["us"])[:5]:
            print(f"  fused, {swept['config']}: {swept['us']:6.2f} us", flush=True)


# --sweep: (num_splits, tile, num_warps, num_stages) of the fused decode
SWEEP = list(itertools.product((2, 3, 4, 6, 8), (64, 128), (4, 8), (2, 3)))


def rope_row(batch: int, layers: int, context: int, bs: int, sweep: bool = False) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(2)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    freqs = torch.outer(torch.arange(8192, device="cuda").float(), inv_freq)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q_w, k_w = ((torch.rand(D, device="cuda", generator=gen) + 0.5).to(DTYPE) for _ in range(2))
    inp = make_decode_inputs(batch * layers, context, bs)   # seq_lens: the new token is token context - 1
    qkv = torch.randn(batch, (HQ + 2 * HKV) * D, device="cuda", generator=gen).to(DTYPE)
    q, k, v = (t.view(batch, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
    positions = torch.full((batch,), context - 1, device="cuda", dtype=torch.int64)
    tables = inp["block_tables"].view(layers, batch, -1)
    ropes = [DecodeRope(k=k, v=v, positions=positions, cos_sin_cache=cos_sin, q_weight=q_w, k_weight=k_w,
                        slot_mapping=(t[:, (context - 1) // bs].long() * bs + (context - 1) % bs)) for t in tables]
    seq_lens, kc, vc = inp["seq_lens"][:batch], inp["k_cache"], inp["v_cache"]

    def unfused(i: int) -> None:
        q_out, _, _ = qk_norm_rope_triton(q, k, v, positions, cos_sin, head_dim=D, rotary_dim=D, q_weight=q_w,
                                          k_weight=k_w, k_cache=kc, v_cache=vc, slot_mapping=ropes[i].slot_mapping)
        decode_attention(q_out, kc, vc, seq_lens, tables[i], 4096, SCALE)

    def fused(i: int) -> None:
        decode_attention(q, kc, vc, seq_lens, tables[i], 4096, SCALE, rope=ropes[i])

    def plain(i: int) -> None:
        decode_attention(q, kc, vc, seq_lens, tables[i], 4096, SCALE)

    row: dict = dict(kernel="decode_rope", batch=batch, context=context, block_size=bs, layers=layers)
    for name, fn in (("unfused", unfused), ("fused", fused), ("decode_alone", plain)):
        before = decode_variants()
        row[f"{name}_us"] = graph_us(fn, layers)
        new = [k for key, k in decode_variants().items() if key not in before and hasattr(k, "n_regs")]   # by fn
        row[f"{name}_regs_spills"] = [(k.n_regs, k.n_spills) for k in new]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    row["fused_config"] = dict(num_splits=choose_num_splits(batch, HKV, 4096, sms), tile=choose_tile(bs, D))
    for splits, tile, warps, stages in SWEEP if sweep else ():
        config = dict(num_splits=splits, tile=tile, num_warps=warps, num_stages=stages)

        def swept(i: int, config: dict = config) -> None:
            decode_attention(q, kc, vc, seq_lens, tables[i], 4096, SCALE, rope=ropes[i], **config)
        try:
            row.setdefault("sweep", []).append(dict(config=config, us=graph_us(swept, layers)))
        except Exception as exc:   # a variant that does not compile or fit
            print(f"  skip {config}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
    return row


def decode_variants() -> dict[int, Any]:
    """The decode split kernel's compiled variants so far (id -> compiled kernel: n_regs, n_spills)."""
    found: dict[int, Any] = {}
    for cache in getattr(decode_split_kernel, "device_caches", {}).values():   # none under the interpreter
        for part in cache if isinstance(cache, tuple) else ():
            if isinstance(part, dict):
                found.update({id(kernel): kernel for kernel in part.values()})
    return found


def bench_store(results: list[dict]) -> None:
    tokens = 8192
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, device="cuda", dtype=DTYPE)
    key = qkv[:, HQ * D:(HQ + HKV) * D].view(tokens, HKV, D)
    value = qkv[:, (HQ + HKV) * D:].view(tokens, HKV, D)
    num_blocks, bs = 4096, 16
    k_cache = torch.empty(num_blocks, bs, HKV, D, device="cuda", dtype=DTYPE)
    v_cache = torch.empty_like(k_cache)
    slots = torch.randperm(num_blocks * bs, device="cuda")[:tokens]
    ms = median_ms(lambda: store_kvcache(key, value, k_cache, v_cache, slots))
    nbytes = 4 * tokens * HKV * D * DTYPE.itemsize  # K and V, read + written
    results.append(dict(kernel="store_kvcache", tokens=tokens, ms=ms, bytes_per_s=nbytes / (ms * 1e-3)))
    print(f"store_kvcache T={tokens}: {ms * 1e3:.1f} us, {nbytes / ms / 1e9:.3f} TB/s", flush=True)


def bench_prefill(results: list[dict], quick: bool) -> None:
    num_seqs, q_len, prefix, bs = 8, 2048, 0, 16
    ctx = q_len + prefix
    gen = torch.Generator(device="cuda").manual_seed(1)
    per_seq = triton.cdiv(ctx, bs)
    k_cache = torch.randn(num_seqs * per_seq, bs, HKV, D, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_seqs * per_seq, device="cuda").to(torch.int32).view(num_seqs, per_seq)
    q = torch.randn(num_seqs * q_len, HQ, D, device="cuda", dtype=DTYPE, generator=gen)
    cu = torch.arange(0, num_seqs + 1, device="cuda", dtype=torch.int32) * q_len
    seq_lens = torch.full((num_seqs,), ctx, device="cuda", dtype=torch.int32)
    flops = num_seqs * 4 * HQ * D * q_len * (q_len + 1) / 2  # causal: QK^T and PV
    configs = [dict()] + [dict(block_m=m, tile_n=n, num_warps=w, num_stages=s)
                          for m, n, w, s in itertools.product((64, 128), (32, 64), (4, 8), (2, 3))
                          if not quick or (m, w) == (128, 8)]
    rows = []
    for cfg in configs:
        try:
            ms = median_ms(lambda cfg=cfg: prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, q_len,
                                                             SCALE, **cfg))
        except Exception as exc:
            print(f"  skip {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        rows.append((ms, cfg))
    best_ms, best = min(rows, key=lambda r: r[0])
    qd = q.view(num_seqs, q_len, HQ, D).transpose(1, 2)
    kd = torch.randn(num_seqs, HKV, q_len, D, device="cuda", dtype=DTYPE)
    try:
        sdpa_ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
            qd, kd, kd, is_causal=True, scale=SCALE, enable_gqa=True))
    except Exception:  # an older torch without enable_gqa
        sdpa_ms = float("nan")
    for label, ms, cfg in (("default", rows[0][0], rows[0][1]), ("best", best_ms, best),
                           ("torch sdpa dense", sdpa_ms, {})):
        results.append(dict(kernel="prefill", which=label, seqs=num_seqs, q_len=q_len, ms=ms,
                            tflops=flops / (ms * 1e-3) / 1e12, config=cfg))
        print(f"prefill {num_seqs}x{q_len} BS={bs} {label:16s} {ms * 1e3:8.1f} us "
              f"{flops / (ms * 1e-3) / 1e12:6.1f} TFLOP/s {cfg}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller prefill sweep")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop sweeping after this long")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--block-sizes", default="16,32,64,128,256")
    parser.add_argument("--rope", action="store_true", help="only the fused decode's timing (see above)")
    parser.add_argument("--rope-batches", default="1,16,64")
    parser.add_argument("--layers", type=int, default=28, help="--rope: calls per graph, on distinct caches")
    parser.add_argument("--sweep", action="store_true", help="--rope: also sweep the fused decode's launch")
    args = parser.parse_args()
    start = time.time()
    header = dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
                  gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__)
    print(header, flush=True)
    results: list[dict] = []
    if args.rope:
        bench_rope([int(b) for b in args.rope_batches.split(",")], args.layers, results, sweep=args.sweep)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(header, results=results), f, indent=1)
        return
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth: {copy_bw / 1e12:.3f} TB/s (read + write)", flush=True)
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    tuned: dict[int, dict] = {}
    deadline = start + args.budget_s
    bench_decode(256, 1024, block_sizes, copy_bw, results, tuned, deadline)
    bench_decode(32, 4096, block_sizes, copy_bw, results, tuned, deadline)
    bench_store(results)
    bench_prefill(results, args.quick)
    print("\nsummary (best config per block size; ratio = KV bytes/s over copy bandwidth):")
    for r in results:
        if r["kernel"] == "decode":
            print(f"  B={r['batch']:4d} ctx={r['context']:5d} BS={r['block_size']:4d} {r['which']:7s} "
                  f"{r['bytes_per_s'] / 1e12:6.3f} TB/s  {100 * r['ratio_to_copy']:5.1f}%")
    print(f"elapsed {time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header, copy_bytes_per_s=copy_bw, results=results), f, indent=1)


if __name__ == "__main__":
    main()
