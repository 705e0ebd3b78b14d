"""Tensor-parallel engine figures for one TP size, through the `LLM` API, on a random-weight checkpoint:
batch-1 decode ms per token, then the headline workload twice (as benchmarks/headline_runs.py: run 1 is
the first timed run after the engine starts, run 2 the second). Prints one `RESULT {json}` line.

    python3 benchmarks/tp_engine_bench.py --tp 2 [--shape qwen3-8b] [--disable-custom-all-reduce] [--no-async]

Run it once per TP size (each in its own process: the GPUs' memory is the engine's alone).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from nv_engine import LLM, SamplingParams
from nv_engine.entrypoints.bench.throughput import make_workload
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint


def _timed_generate(llm: LLM, prompts: list[dict], params: list[SamplingParams] | SamplingParams) -> tuple[float, int]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    return wall, sum(len(o.outputs[0].token_ids) for o in outputs)


def batch1_ms_per_token(llm: LLM, short: int = 32, long: int = 288) -> float:
    """Decode time per token of one sequence: (time of `long` tokens - time of `short`) / (long - short),
    which cancels the prefill and the per-request overhead."""
    prompt = [{"prompt_token_ids": list(range(100, 228))}]             # 128 tokens

    def run(n: int) -> float:
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n)
        return min(_timed_generate(llm, prompt, params)[0] for _ in range(3))

    run(short)                                                           # warm-up
    return 1e3 * (run(long) - run(short)) / (long - short)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--no-async", action="store_true", help="async_scheduling=False")
    args = p.parse_args()
    model = str(nv_cache_dir() / f"bench-random-{args.shape}-bf16")
    if not any(Path(model).glob("*.safetensors")):
        write_random_checkpoint(model, args.shape, dtype="bfloat16", device="cuda")
    started = time.perf_counter()
    llm = LLM(model, max_model_len=4096, tensor_parallel_size=args.tp,
              disable_custom_all_reduce=args.disable_custom_all_reduce,
              async_scheduling=False if args.no_async else None)
    result: dict[str, object] = {"tp": args.tp, "shape": args.shape, "start_s": time.perf_counter() - started,
                                 "custom_all_reduce": not args.disable_custom_all_reduce,
                                 "async_scheduling": llm.llm_engine.async_scheduling}
    vocab = llm.config.hf_config.vocab_size
    work = make_workload(args.num_prompts, (100, 1024), (100, 1024), max_token_id=min(10000, vocab - 1))
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in work.max_tokens]
    prompts = [{"prompt_token_ids": p} for p in work.prompts]
    for run in (1, 2):
        wall, tokens = _timed_generate(llm, prompts, params)
        result[f"run{run}_output_tok_s"] = tokens / wall
        result[f"run{run}_wall_s"] = wall
    result["batch1_ms_per_token"] = batch1_ms_per_token(llm)
    print("RESULT", json.dumps(result), flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main()
