"""The persistent decoder-layer kernel (nv_kernels.decode_layer) alone: microseconds per layer in a CUDA graph of
one decode step's layers (distinct random weights and caches per layer, so the weights stream from HBM as in the
model), and with --phases where each program spends its time (its timer after each phase and grid barrier).

    python3 scripts/bench_decode_layer.py [--shape 0.6b|8b] [--rows 1,16] [--context 1024] [--phases]
        [--no-prefetch] [--warps 4]

NV_DECODE_LAYER_PROGRAMS_PER_SM caps the grid (programs per SM, default 4; fewer where they do not all fit).
"""
from __future__ import annotations

import argparse
import json

import torch

from nv_kernels.decode_layer import DecodeLayer
from nv_kernels.testing import random_paged_batch, rotary_cos_sin

SHAPES = {"0.6b": (1024, 16, 8, 128, 3072, 28), "8b": (4096, 32, 8, 128, 12288, 36)}
PHASES = ["wait", "A qkv", "sync", "B attention", "sync", "C o", "sync", "D gate_up", "sync", "E down"]


def build(shape: str, rows: int, context: int, block_size: int):
    hidden, hq, hkv, d, inter, layers = SHAPES[shape]
    cos_sin = rotary_cos_sin(8192, d, base=1e6, device="cuda")

    def rand(*size: int) -> torch.Tensor:
        return (torch.randn(*size, device="cuda") * size[-1] ** -0.5).to(torch.bfloat16)

    built = []
    for i in range(layers):
        layer = DecodeLayer(input_norm=torch.ones(hidden, dtype=torch.bfloat16, device="cuda"),
                            post_norm=torch.ones(hidden, dtype=torch.bfloat16, device="cuda"),
                            qkv=rand((hq + 2 * hkv) * d, hidden), o=rand(hidden, hq * d),
                            gate_up=rand(2 * inter, hidden), down=rand(hidden, inter), cos_sin_cache=cos_sin,
                            num_q_heads=hq, num_kv_heads=hkv, head_dim=d, eps=1e-6,
                            q_norm=torch.ones(d, dtype=torch.bfloat16, device="cuda"),
                            k_norm=torch.ones(d, dtype=torch.bfloat16, device="cuda"))
        batch = random_paged_batch([context] * rows, [1] * rows, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                   block_size=block_size, dtype=torch.bfloat16, device="cuda", seed=i)
        built.append((layer, batch))
    return built, hidden


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    p.add_argument("--rows", default="1,16")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--phases", action="store_true")
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--warps", type=int, default=4)
    args = p.parse_args()
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    for rows in [int(r) for r in args.rows.split(",")]:
        built, hidden = build(args.shape, rows, args.context, args.block_size)
        x = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
        stamps = torch.zeros(len(built), programs, 16, dtype=torch.int64, device="cuda")

        def step(timed: bool, x: torch.Tensor = x, built: list = built, stamps: torch.Tensor = stamps) -> None:
            h, r = x, x
            for i, (layer, b) in enumerate(built):
                h, r = layer(h, r, k_cache=b.k_cache, v_cache=b.v_cache, seq_lens=b.seq_lens,
                             block_tables=b.block_tables, positions=(b.seq_lens - 1).long(),
                             slot_mapping=b.slot_mapping, max_seqlen_k=4096, scale=0.088,
                             prefetch=not args.no_prefetch, num_warps=args.warps,
                             timestamps=stamps[i] if timed else None)

        step(False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(False)
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / 50 / len(built)
        row = {"shape": args.shape, "rows": rows, "context": args.context, "us_per_layer": round(us, 2),
               "prefetch": not args.no_prefetch, "warps": args.warps}
        if args.phases:
            step(True)
            torch.cuda.synchronize()
            t = stamps[:, :, :11].double()
            spans = (t[:, :, 1:] - t[:, :, :-1]) / 1e3                      # [L, P, 10] us
            row["phase_mean_us"] = dict(zip([f"{i}:{n}" for i, n in enumerate(PHASES)],
                                            [round(v, 2) for v in spans.mean(dim=(0, 1)).tolist()], strict=True))
            row["layer_span_us"] = round(((t[:, :, 10].amax(1) - t[:, :, 0].amin(1)) / 1e3).mean().item(), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
