"""FP8 KV cache against the default (bf16) cache on one GPU. Prints one JSON line per measurement.

    python3 benchmarks/bench_kv_fp8.py decode-bw [--block-size 64] [--sweep] [--ragged] [--shapes 256x1024,64x4096]
                                                 [--tiles 32,64,128,256]
        paged decode attention (Qwen3-0.6B shape: Hq 16, Hkv 8, D 128) at batch 256 x context 1024 and
        batch 64 x context 4096 (or --shapes: BATCHxCONTEXT, ...), bf16 vs FP8 cache (scales per tensor, and per
        (KV head, channel) as the engine calibrates them; V token-major as the engine stores it, and V laid out
        like K for comparison): KV bytes read / time, over the copy bandwidth.
        --sweep: also times the engine's FP8 cache over the kernel's launch parameters (FP8_SWEEP: splits x
        tile x num_warps x num_stages; --tiles keeps those tiles only) and prints today's launch, the five
        fastest and the fastest at each split count ("best_at_splits": what a rule for choose_num_splits needs),
        each with its share of the copy bandwidth (one JSON line each, "bench": "decode_bw_sweep").
        --ragged: each sequence's context drawn uniformly from [context / 2, 3 context / 2] (seeded), as the
        headline's decode batches hold them, instead of every context a multiple of every tile: most sequences
        then end in a partial KV tile (read, and masked, in full).
    python3 benchmarks/bench_kv_fp8.py long [--shape qwen3-0.6b] [--num-prompts 64] [--prompt-len 3000]
                                         [--output-len 384] [--kv-cache-dtypes auto,fp8]
        end to end through LLM.generate (random weights), auto vs fp8 (or the KV cache dtypes named), one engine
        after the other: output tok/s, KV blocks.
    python3 benchmarks/bench_kv_fp8.py logprobs [GGUF]
        SmolLM2-135M-Instruct in bf16, fp8 KV vs bf16 KV, greedy 64 tokens on 20 chat prompts, by vLLM's
        check_logprobs_close rule (top 5): prints how many prompts diverge and whether the rule holds.

Run with every package's src dir on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

# decode-bw --sweep: (num_splits, tile, num_warps, num_stages) of triton_decode.decode_attention on the FP8 cache;
# holds today's launch (decode_tuning's splits and FP8 tile, 4 warps, 2 stages) at both shapes
FP8_SWEEP = list(itertools.product((1, 2, 4, 8, 16), (32, 64, 128, 256), (4, 8), (2, 3, 4)))
SWEEP_SHOWN = 5
DEFAULT_SHAPES = ((256, 1024), (64, 4096))


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """"256x1024,64x4096" -> ((256, 1024), (64, 4096)): (batch, context) pairs."""
    shapes = []
    for item in text.split(","):
        batch, sep, context = item.strip().partition("x")
        if not sep or not batch.isdigit() or not context.isdigit() or int(batch) < 1 or int(context) < 1:
            raise argparse.ArgumentTypeError(f"a shape is BATCHxCONTEXT (positive integers), got {item!r}")
        shapes.append((int(batch), int(context)))
    return tuple(shapes)


def parse_tiles(text: str) -> tuple[int, ...]:
    """"64,128" -> (64, 128): tiles of FP8_SWEEP."""
    known = sorted({tile for _, tile, _, _ in FP8_SWEEP})
    tiles = tuple(int(t) for t in text.split(",") if t.strip().isdigit())
    if not tiles or any(t not in known for t in tiles):
        raise argparse.ArgumentTypeError(f"--tiles takes tiles of the sweep ({known}), got {text!r}")
    return tiles


def best_per_split(rows: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
    """(ms, launch config) rows -> the fastest row at each num_splits, by split count."""
    best: dict[int, tuple[float, dict]] = {}
    for ms, config in rows:
        splits = config["num_splits"]
        if splits not in best or ms < best[splits][0]:
            best[splits] = (ms, config)
    return [best[splits] for splits in sorted(best)]


def decode_lengths(batch: int, context: int, ragged: bool, seed: int = 0) -> list[int]:
    """Per-sequence context lengths: all `context`, or (ragged) uniform in [context // 2, 3 * context // 2]."""
    if not ragged:
        return [context] * batch
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(context // 2, 3 * context // 2 + 1, (batch,), generator=gen).tolist()


def decode_bandwidth(block_size: int, sweep: bool = False, ragged: bool = False,
                     shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES,
                     tiles: tuple[int, ...] | None = None) -> None:
    import triton
    from triton.testing import do_bench

    from nv_kernels.kv_layout import to_token_major
    from nv_kernels.kv_quant import quantize
    from nv_kernels.triton_decode import decode_attention

    hq, hkv, d = 16, 8, 128
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)   # 2 GiB
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 2 / (do_bench(lambda: dst.copy_(src), rep=200, return_mode="median") * 1e-3)
    src = dst = torch.empty(0)
    for batch, context in shapes:
        lengths = decode_lengths(batch, context, ragged)
        max_len = max(lengths)
        per_seq = triton.cdiv(max_len, block_size)
        num_blocks = batch * per_seq
        gen = torch.Generator(device="cuda").manual_seed(0)
        shape = (num_blocks, block_size, hkv, d)
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        table = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32).view(batch, per_seq)
        lens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
        scale = torch.tensor([0.02], device="cuda")
        per_channel = torch.full((hkv, d), 0.02, device="cuda")   # the engine's calibrated scales: [Hkv, D]
        k8, v8 = quantize(k, scale, torch.float8_e4m3fn), quantize(v, scale, torch.float8_e4m3fn)
        v8_tokens = to_token_major(v8)   # the engine's FP8 layout (nv_kernels.kv_layout)
        caches = {"bf16": (k, v, {}), "fp8_e4m3": (k8, v8_tokens, {"k_scale": scale, "v_scale": scale}),
                  "fp8_e4m3_per_channel": (k8, v8_tokens, {"k_scale": per_channel, "v_scale": per_channel}),
                  "fp8_e4m3_v_like_k": (k8, v8, {"k_scale": scale, "v_scale": scale})}
        for name, (kc, vc, scales) in caches.items():
            args = (q, kc, vc, lens, table, max_len, d ** -0.5)
            ms = do_bench(lambda args=args, scales=scales: decode_attention(*args, **scales), warmup=10, rep=100,
                          return_mode="median")
            kv_bytes = 2 * sum(lengths) * hkv * d * kc.element_size()
            print(json.dumps({"bench": "decode_bw", "cache": name, "batch": batch, "context": context,
                              "ragged": ragged, "block_size": block_size, "ms": round(ms, 4),
                              "kv_gb_s": round(kv_bytes / (ms * 1e-3) / 1e9, 1),
                              "of_copy_bw": round(kv_bytes / (ms * 1e-3) / copy_bw, 3)}), flush=True)
        if sweep:
            kc, vc, scales = caches["fp8_e4m3_per_channel"]
            sweep_fp8_launch((q, kc, vc, lens, table, max_len, d ** -0.5), scales, copy_bw, sum(lengths), tiles)


def sweep_fp8_launch(args: tuple, scales: dict, copy_bw: float, kv_tokens: int,
                     tiles: tuple[int, ...] | None = None) -> None:
    """Time decode_attention(*args, **scales) at every FP8_SWEEP launch (of these tiles; None: all); print today's,
    the fastest and the fastest per split count (kv_tokens: the context tokens of all sequences together)."""
    from triton.testing import do_bench

    from nv_kernels.decode_tuning import choose_num_splits, choose_tile, num_sms
    from nv_kernels.triton_decode import decode_attention

    q, k_cache = args[0], args[1]
    batch, (_, block_size, hkv, d), context = q.shape[0], k_cache.shape, args[5]
    kv_bytes = 2 * kv_tokens * hkv * d * k_cache.element_size()
    today = dict(num_splits=choose_num_splits(batch, hkv, context, num_sms(q.device), fp8=True),
                 tile=choose_tile(block_size, d, fp8=True), num_warps=4, num_stages=2)
    rows = []
    for splits, tile, warps, stages in FP8_SWEEP:
        if tiles is not None and tile not in tiles:
            continue
        config = dict(num_splits=splits, tile=tile, num_warps=warps, num_stages=stages)
        try:
            ms = do_bench(lambda config=config: decode_attention(*args, **scales, **config), warmup=10, rep=50,
                          return_mode="median")
        except Exception as exc:   # a launch that does not compile or fit (shared memory, registers)
            print(f"  skip {config}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
            continue
        rows.append((ms, config))
    rows.sort(key=lambda row: row[0])
    today_rows = [row for row in rows if row[1] == today]
    shown = ([("today", row) for row in today_rows] + [("fastest", row) for row in rows[:SWEEP_SHOWN]]
             + [("best_at_splits", row) for row in best_per_split(rows)])
    for label, (ms, config) in shown:
        print(json.dumps({"bench": "decode_bw_sweep", "which": label, "batch": batch, "context": context,
                          "block_size": block_size, **config, "ms": round(ms, 4),
                          "of_copy_bw": round(kv_bytes / (ms * 1e-3) / copy_bw, 3)}), flush=True)


def long_contexts(shape: str, num_prompts: int, prompt_len: int, output_len: int,
                  kv_cache_dtypes: tuple[str, ...] = ("auto", "fp8")) -> None:
    from pathlib import Path

    from nv_engine import LLM, SamplingParams
    from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

    model = str(nv_cache_dir() / f"bench-random-{shape}-bf16")
    if not (Path(model) / "model.safetensors").exists():
        write_random_checkpoint(model, shape, dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 10000, (prompt_len,), generator=gen).tolist()}
               for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=output_len)
    for kv in kv_cache_dtypes:
        llm = LLM(model, max_model_len=prompt_len + output_len + 16, kv_cache_dtype=kv)
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)   # compile outside the timing
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(json.dumps({"bench": "long", "kv_cache_dtype": kv, "num_prompts": num_prompts, "prompt_len": prompt_len,
                          "output_len": output_len, "num_blocks": llm.llm_engine.num_blocks,
                          "output_tok_s": round(tokens / wall, 1),
                          "total_tok_s": round((tokens + num_prompts * prompt_len) / wall, 1),
                          "wall_s": round(wall, 2)}), flush=True)
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()


def logprobs_closeness(gguf: str | None) -> None:
    from nv_engine import LLM, SamplingParams
    from nv_engine.model_loader.gguf import default_gguf_path

    questions = ["What is the capital of France?", "Explain why the sky is blue.", "Write a haiku about autumn.",
                 "How do vaccines work?", "Give me three tips for better sleep.", "What is photosynthesis?",
                 "Describe the water cycle.", "Why do cats purr?", "What is a prime number?",
                 "How does a rainbow form?", "Name three planets in our solar system.", "What causes earthquakes?",
                 "How do I boil an egg?", "What is the tallest mountain on Earth?", "Explain gravity to a child.",
                 "What is machine learning?", "Why is exercise good for you?", "How do bees make honey?",
                 "What is the speed of light?", "Write a short poem about the sea."]
    params = SamplingParams(temperature=0.0, max_tokens=64, logprobs=5, ignore_eos=True)
    runs = {}
    for kv in ("auto", "fp8"):
        with LLM(gguf or str(default_gguf_path()), dtype="bfloat16", kv_cache_dtype=kv, max_model_len=1024) as llm:
            outs = llm.chat([[{"role": "user", "content": q}] for q in questions], params, use_tqdm=False)
        runs[kv] = [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
                    for o in outs]
    diverged, violations, firsts = 0, [], []
    for i, ((ids_a, lps_a), (ids_b, lps_b)) in enumerate(zip(runs["auto"], runs["fp8"], strict=True)):
        first = next((p for p, (a, b) in enumerate(zip(ids_a, ids_b, strict=True)) if a != b), None)
        firsts.append(first)
        if first is None:
            continue
        diverged += 1
        if ids_a[first] not in lps_b[first] or ids_b[first] not in lps_a[first]:
            violations.append(i)
    print(json.dumps({"bench": "logprobs_close", "prompts": len(questions), "diverged": diverged,
                      "first_differences": firsts, "rule_violations": violations,
                      "check_logprobs_close": not violations}), flush=True)


def kv_cache_dtypes(text: str) -> tuple[str, ...]:
    """--kv-cache-dtypes: comma-separated names the engine takes (KV_CACHE_DTYPES), checked before any checkpoint
    is written."""
    from nv_engine.config.engine_config import KV_CACHE_DTYPES

    names = tuple(text.split(","))
    unknown = [name for name in names if name not in KV_CACHE_DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown KV cache dtype {', '.join(unknown)}; one of "
                                         f"{', '.join(KV_CACHE_DTYPES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    bw = sub.add_parser("decode-bw")
    bw.add_argument("--block-size", type=int, default=64)
    bw.add_argument("--sweep", action="store_true", help="also sweep the FP8 decode kernel's launch parameters")
    bw.add_argument("--ragged", action="store_true", help="contexts uniform in [context / 2, 3 context / 2]")
    bw.add_argument("--shapes", type=parse_shapes, default=DEFAULT_SHAPES,
                    help="BATCHxCONTEXT,... (default 256x1024,64x4096)")
    bw.add_argument("--tiles", type=parse_tiles, default=None, help="--sweep: only these tiles, e.g. 128")
    long = sub.add_parser("long")
    long.add_argument("--shape", default="qwen3-0.6b")
    long.add_argument("--num-prompts", type=int, default=64)
    long.add_argument("--prompt-len", type=int, default=3000)
    long.add_argument("--output-len", type=int, default=384)
    long.add_argument("--kv-cache-dtypes", type=kv_cache_dtypes, default=("auto", "fp8"),
                      help="the KV cache dtypes to run, one engine each, e.g. fp8")
    lp = sub.add_parser("logprobs")
    lp.add_argument("gguf", nargs="?")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.what == "decode-bw":
        decode_bandwidth(args.block_size, args.sweep, args.ragged, args.shapes, args.tiles)
    elif args.what == "long":
        long_contexts(args.shape, args.num_prompts, args.prompt_len, args.output_len, args.kv_cache_dtypes)
    else:
        logprobs_closeness(args.gguf)


if __name__ == "__main__":
    main()
