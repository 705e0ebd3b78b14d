"""`nv bench`: the headline workload of BENCHMARKS.md (nano-vllm's bench.py), with vLLM's
throughput line and the ratio to the floor set by the bytes the run must read.

Workload: seed(0); per prompt randint(0, 10000) ids, randint(100, 1024) of them; per prompt
max_tokens randint(100, 1024); temperature 0.6, ignore_eos; max_model_len 4096. A warm-up (on a GPU
every batch shape of the workload; elsewhere two short requests), then the timed generate (prefill
included), its progress on stderr. The workload flags are checked before any checkpoint is written or
loaded.
Floor: every decode step reads all weights once (as the runtime stores them: quantized projections at
their FP8 or INT4 size with their scales), and every generated token reads the KV of its whole context
(at the KV cache dtype's element size: an FP8 cache reads half a bf16 one's bytes);
over the copy bandwidth measured in this process (read + write bytes / time).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from random import randint, seed
from typing import Any

import torch

from nv_engine.config.engine_args import EngineArgs
from nv_kernels.jit_watch import TritonCompileWatch

# off a GPU (no Triton compiles, no CUDA graphs to warm) the warm-up is this many requests of this size
SMALL_WARMUP_REQUESTS = 2
SMALL_WARMUP_PROMPT_TOKENS = 16
SMALL_WARMUP_OUTPUT_TOKENS = 2


@dataclass
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)


def make_workload(num_prompts: int = 256, input_len: tuple[int, int] = (100, 1024),
                  output_len: tuple[int, int] = (100, 1024), max_token_id: int = 10000,
                  random_seed: int = 0) -> Workload:
    """nano-vllm's bench.py generator, in its exact call order (the defaults reproduce it)."""
    seed(random_seed)
    prompts = [[randint(0, max_token_id) for _ in range(randint(*input_len))] for _ in range(num_prompts)]
    max_tokens = [randint(*output_len) for _ in range(num_prompts)]
    return Workload(prompts, max_tokens)


def copy_bandwidth(device: torch.device, num_bytes: int = 1 << 30, iters: int = 20) -> float:
    """Bytes/s of a device copy, read + write counted (PERF-NOTES' convention)."""
    if device.type == "cuda":
        n = num_bytes // 2
        src = torch.empty(n, dtype=torch.bfloat16, device=device).fill_(1)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iters
        del src, dst
        torch.cuda.empty_cache()
        return 2 * num_bytes / seconds
    n = min(num_bytes, 256 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    return 2 * 4 * n * 5 / (time.perf_counter() - t)


LINEAR_WEIGHT_SUFFIX = "_proj.weight"     # q/k/v/o and gate/up/down projections of Qwen3 and Llama checkpoints
# safetensors' dtype names: the float weights that load at the model's dtype, and the stored bytes per element
# of everything else
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
STORED_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                   "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def checkpoint_weight_bytes(model_dir: str, itemsize: int, quantization: str | None = None) -> int:
    """Bytes of weights a decode step reads, from the checkpoint's *.safetensors (tied embeddings counted once):
    floating-point tensors at the model's `itemsize`, except that with `quantization` ("fp8", "awq", "gptq")
    an unquantized checkpoint's projection weights count as the runtime stores them after nv quantizes them.
    A quantized checkpoint's own tensors (FP8 weights and scales, INT4 words and scales) count as stored, its INT4
    zeros as the runtime unpacks them."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                tensor = f.get_slice(name)
                shape = tensor.get_shape()
                numel = math.prod(shape)
                dtype = tensor.get_dtype()
                if name.endswith(".g_idx"):        # GPTQ's trivial input order: checked and dropped on load
                    continue
                if name.endswith(".qzeros"):       # AWQ / GPTQ: eight 4-bit zeros per int32, held a byte each
                    total += numel * 8
                elif dtype not in FLOAT_DTYPES or not name.endswith(".weight"):
                    total += numel * STORED_ITEMSIZE.get(dtype, itemsize)  # quantized already, or scales, zeros
                elif quantization is not None and name.endswith(LINEAR_WEIGHT_SUFFIX) and len(shape) == 2:
                    total += quantized_linear_bytes(shape[0], shape[1], quantization)
                else:
                    total += numel * itemsize
    return total


def quantized_linear_bytes(rows: int, cols: int, quantization: str) -> int:
    """What nv stores for a [rows, cols] projection quantized online: FP8 one byte per weight plus an fp32 scale per
    128 x 128 block (nv_kernels.fp8_block_gemm); INT4 half a byte plus, per group of 128 inputs, a float16 scale
    and a uint8 zero (nv_kernels.int4_gemm)."""
    from nv_kernels.fp8_block_gemm import GROUP as FP8_BLOCK
    from nv_kernels.int4_gemm import GROUP as INT4_GROUP

    if quantization == "fp8":
        return rows * cols + 4 * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK)
    return rows * cols // 2 + rows * math.ceil(cols / INT4_GROUP) * 3


def kv_bytes_per_token(hf_config: Any, kv_dtype: torch.dtype) -> int:
    """Bytes of K and V one token stores (and every later token of its sequence reads) over all layers, at the
    KV cache's element size (an FP8 cache: 1 byte; its per-layer scales are read once per step, not per
    token, so they do not count)."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    itemsize = torch.empty(0, dtype=kv_dtype).element_size()
    return 2 * hf_config.num_hidden_layers * hf_config.num_key_value_heads * head_dim * itemsize


def floor_bytes(work: Workload, weight_bytes: int, kv_bytes_per_token: int, max_num_seqs: int) -> dict:
    """Bytes the run must read: weights once per decode step, KV of the whole context per token."""
    decode_steps = max(max(work.max_tokens), math.ceil(work.output_tokens / max_num_seqs))
    context_reads = sum(out * len(p) + out * (out + 1) // 2
                        for p, out in zip(work.prompts, work.max_tokens, strict=True))
    return dict(decode_steps=decode_steps, weight_bytes=weight_bytes * decode_steps,
                kv_bytes=kv_bytes_per_token * context_reads,
                total_bytes=weight_bytes * decode_steps + kv_bytes_per_token * context_reads)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The workload flags plus every engine argument (EngineArgs); max_model_len defaults to the
    workload's 4096."""
    p.add_argument("--model", help="HF checkpoint directory, .gguf file or hub id")
    p.add_argument("--random-weights", action="store_true", help="write a random checkpoint of --shape")
    p.add_argument("--shape", default="qwen3-0.6b", help="random checkpoint shape: qwen3-0.6b, qwen3-8b or tiny")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--min-input-len", type=int, default=100)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--min-output-len", type=int, default=100)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--disable-tqdm", action="store_true",
                   help="no progress bar on stderr during the timed run (its refreshes run inside the timed region)")
    p.add_argument("--json", dest="json_path", help="also write the results as JSON here")
    EngineArgs.add_cli_arguments(p)
    p.set_defaults(max_model_len=4096)


def bench_arguments_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the workload flags, naming the flag (None when nothing is): checked before a
    checkpoint is written or loaded, so a bad range costs no start-up."""
    if args.num_prompts < 1:
        return f"--num-prompts must be at least 1, got {args.num_prompts}"
    for kind in ("input", "output"):
        low, high = getattr(args, f"min_{kind}_len"), getattr(args, f"max_{kind}_len")
        if low < 1:
            return f"--min-{kind}-len must be at least 1, got {low}"
        if high < low:
            return f"--max-{kind}-len ({high}) must be at least --min-{kind}-len ({low})"
    longest = args.max_input_len + args.max_output_len
    if args.max_model_len is not None and longest > args.max_model_len:
        return (f"--max-input-len {args.max_input_len} + --max-output-len {args.max_output_len} = {longest} "
                f"tokens do not fit --max-model-len {args.max_model_len}: lower them or raise --max-model-len")
    if args.temperature < 0:
        return f"--temperature must be at least 0, got {args.temperature}"
    if args.random_weights or args.model is None:
        from nv_engine.model_loader.random_model import SHAPES

        if args.shape not in SHAPES:
            return f"--shape {args.shape!r} is not a known shape; known: {', '.join(SHAPES)}"
    return None


def check_bench_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error (exit status 2) on a bad workload flag, before any work."""
    problem = bench_arguments_error(args)
    if problem is not None:
        parser.error(problem)


def warm_up(llm, args: argparse.Namespace, max_token_id: int) -> None:
    """Run the workload's shapes once before the clock starts. The engine's start-up warm-up
    (core/warmup_steps.py) is meant to compile every variant already; this one stays as a second net
    and its compiles are reported (`warmup_triton_compiles`: empty when the engine's covered all). Triton
    specialises integer arguments (== 1, divisible by 16), so a first run on a fresh machine paid
    several JIT compiles inside the timed region (2026-11-29: 13.5k vs 24.8k tok/s with a warm
    cache). Decode batches shrink through every size class here (17 prompts, max_tokens 1..17),
    and a second generate overflows the step budget (full chunks, a partial chunk, mixed steps).
    Other prompts than the workload's, so the timed run gets no prefix-cache hits from them."""
    from nv_engine.sampling_params import SamplingParams

    shrink = make_workload(17, (args.min_input_len, args.max_input_len), (1, 1), max_token_id=max_token_id,
                           random_seed=12345)
    llm.generate([{"prompt_token_ids": p} for p in shrink.prompts],
                 [SamplingParams(temperature=args.temperature, max_tokens=i + 1, ignore_eos=True) for i in range(17)],
                 use_tqdm=False)
    budget = llm.config.max_num_batched_tokens
    overflow = make_workload(max(8, 2 * budget // max(1, args.max_input_len)),
                             (max(1, args.max_input_len // 2), args.max_input_len),
                             (1, 1), max_token_id=max_token_id, random_seed=54321)
    llm.generate([{"prompt_token_ids": p} for p in overflow.prompts],
                 SamplingParams(temperature=args.temperature, max_tokens=3, ignore_eos=True), use_tqdm=False)


def warm_up_small(llm: Any, args: argparse.Namespace, max_token_id: int) -> None:
    """Off a GPU: SMALL_WARMUP_REQUESTS short requests (first-call allocations and lazy set-up), not the GPU's
    sweep of batch shapes, which is there for Triton compiles and CUDA graphs and takes minutes on a CPU."""
    from nv_engine.sampling_params import SamplingParams

    prompt_len = min(SMALL_WARMUP_PROMPT_TOKENS, args.max_input_len)
    work = make_workload(SMALL_WARMUP_REQUESTS, (prompt_len, prompt_len), (1, 1), max_token_id=max_token_id,
                         random_seed=12345)
    llm.generate([{"prompt_token_ids": p} for p in work.prompts],
                 SamplingParams(temperature=args.temperature, max_tokens=SMALL_WARMUP_OUTPUT_TOKENS, ignore_eos=True),
                 use_tqdm=False)


def run_warm_up(llm: Any, args: argparse.Namespace, device: torch.device, max_token_id: int) -> str:
    """The warm-up for this device (none with --no-warmup), said on stdout; returns what it was."""
    if args.no_warmup:
        return "none"
    if device.type == "cuda":
        print("Warm-up: the workload's batch shapes (Triton compiles, CUDA graphs)", flush=True)
        warm_up(llm, args, max_token_id=max_token_id)
        return "full"
    prompt_len = min(SMALL_WARMUP_PROMPT_TOKENS, args.max_input_len)
    print(f"Warm-up on {device.type}: {SMALL_WARMUP_REQUESTS} short requests ({prompt_len} prompt tokens, "
          f"{SMALL_WARMUP_OUTPUT_TOKENS} output tokens each), not the GPU's sweep of batch shapes", flush=True)
    warm_up_small(llm, args, max_token_id=max_token_id)
    return "small"


def run_bench(args: argparse.Namespace) -> dict:
    from nv_engine.entrypoints.llm import LLM
    from nv_engine.sampling_params import SamplingParams

    problem = bench_arguments_error(args)   # the command line has checked them already: this is for callers
    if problem is not None:
        raise ValueError(problem)
    model = args.model
    if args.random_weights or model is None:
        from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

        model = str(nv_cache_dir() / f"bench-random-{args.shape}-bf16")
        if not (Path(model) / "model.safetensors").exists():
            print(f"writing a random-weight {args.shape} checkpoint (bf16) to {model}", flush=True)
            write_random_checkpoint(model, args.shape, dtype="bfloat16",
                                    device="cuda" if torch.cuda.is_available() else "cpu")
        else:
            print(f"using the random-weight {args.shape} checkpoint in {model}", flush=True)
    from nv_engine.config.engine_config import resolve_device

    device = torch.device(resolve_device(args.device))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    bandwidth = copy_bandwidth(device)      # before the KV cache takes the memory
    llm = LLM(model, **{name: getattr(args, name) for name in EngineArgs.field_names() if name != "model"})
    config = llm.config
    hf = config.hf_config
    work = make_workload(args.num_prompts, (args.min_input_len, args.max_input_len),
                         (args.min_output_len, args.max_output_len),
                         max_token_id=min(10000, hf.vocab_size - 1))
    params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=m) for m in work.max_tokens]
    with TritonCompileWatch() as warmup_jit:   # empty when the engine's start-up warm-up covered it all
        warmup = run_warm_up(llm, args, device, max_token_id=min(10000, hf.vocab_size - 1))
    with TritonCompileWatch() as jit:   # any variant compiled here is JIT time inside the figure
        start = time.perf_counter()
        # progress: LLM.generate's bar over finished requests, on stderr (stdout keeps the result lines)
        outputs = llm.generate([{"prompt_token_ids": p} for p in work.prompts], params,
                               use_tqdm=not args.disable_tqdm)
        wall = time.perf_counter() - start
    output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    itemsize = torch.empty(0, dtype=config.dtype).element_size()
    kv_per_token = kv_bytes_per_token(hf, config.kv_dtype)
    weight_bytes = checkpoint_weight_bytes(config.model, itemsize, config.quantization)
    floor = floor_bytes(work, weight_bytes, kv_per_token, config.max_num_seqs)
    floor_seconds = floor["total_bytes"] / bandwidth
    result = dict(
        requests_per_s=len(outputs) / wall, total_tokens_per_s=(work.prompt_tokens + output_tokens) / wall,
        output_tokens_per_s=output_tokens / wall, wall_s=wall, num_prompts=len(outputs),
        prompt_tokens=work.prompt_tokens, output_tokens=output_tokens, copy_bandwidth_bytes_per_s=bandwidth,
        floor_s=floor_seconds, floor_output_tokens_per_s=output_tokens / floor_seconds,
        floor_ratio=floor_seconds / wall, **floor, device=torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", dtype=str(config.dtype),
        kv_cache_dtype=str(config.kv_dtype), kv_bytes_per_token=kv_per_token, torch=torch.__version__,
        kv_cache_tokens=llm.llm_engine.num_blocks * config.block_size, timed_triton_compiles=jit.variants,
        warmup=warmup, warmup_triton_compiles=warmup_jit.variants, quantization=config.quantization)
    print(f"Throughput: {result['requests_per_s']:.2f} requests/s, {result['total_tokens_per_s']:.2f} "
          f"total tokens/s, {result['output_tokens_per_s']:.2f} output tokens/s")
    print(f"Wall time: {wall:.2f} s for {len(outputs)} requests, {work.prompt_tokens} prompt tokens, "
          f"{output_tokens} output tokens")
    print(f"Floor: {floor['total_bytes'] / 1e12:.3f} TB to read (weights {floor['weight_bytes'] / 1e12:.3f} TB "
          f"over {floor['decode_steps']} decode steps + KV {floor['kv_bytes'] / 1e12:.3f} TB) at "
          f"{bandwidth / 1e12:.3f} TB/s copy bandwidth = {floor_seconds:.2f} s "
          f"({result['floor_output_tokens_per_s']:.0f} output tok/s); this run reaches "
          f"{result['floor_ratio']:.1%} of the floor")
    print(f"KV cache: {result['kv_cache_tokens']} tokens of {kv_per_token} bytes ({result['kv_cache_dtype']}); "
          f"device {result['device']}, {result['dtype']}"
          + (f", {config.quantization} weights" if config.quantization else ""))
    print(f"Triton compiles in the benchmark's warm-up (after the engine's own): {len(warmup_jit.variants)}"
          + "".join(f"\n  {v}" for v in warmup_jit.variants))
    print(f"Triton compiles inside the timed run: {len(jit.variants)}"
          + "".join(f"\n  {v}" for v in jit.variants))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    llm.shutdown()
    return result


__all__ = ["Workload", "add_bench_arguments", "bench_arguments_error", "check_bench_arguments", "copy_bandwidth",
           "checkpoint_weight_bytes", "floor_bytes", "kv_bytes_per_token", "make_workload", "run_bench"]
