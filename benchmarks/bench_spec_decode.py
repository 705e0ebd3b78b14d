"""Speculative decoding (ngram prompt lookup, or a draft model) against plain decoding through `LLM`: ms per output
token, speedup and acceptance rate at small batch, on a repetitive workload and on random prompts; then throughput
at a large batch with speculation configured (it turns itself off above speculative_config's max_batch_size).

    python3 benchmarks/bench_spec_decode.py --random-weights --shape qwen3-0.6b [--batches 1,8] [--k 3,5,7]
    python3 benchmarks/bench_spec_decode.py --model DIR [--batches 1,8] [--large-batch 256]
    python3 benchmarks/bench_spec_decode.py --model DIR --draft-model SMALL_DIR [--k 4]      # method draft_model
    python3 benchmarks/bench_spec_decode.py --random-weights --shape qwen3-8b --draft-shape qwen3-0.6b
    python3 benchmarks/bench_spec_decode.py --random-weights --shape qwen3-0.6b --draft-model self
    python3 benchmarks/bench_spec_decode.py --random-weights --shape qwen3-0.6b --sweep --large-batch 0

--k: num_speculative_tokens, or a list of them (one speculative engine per value, each against the same plain
run). Drafts adapt to each sequence's acceptance (speculative_config.adaptive_draft_length), with either method;
--fixed-length drafts the full k wherever the lookup finds one, or in every step with a draft model (the behaviour
before adaptive lengths).

--sweep: the crossover. Batches 1, 2, 4, 8, 16, 32, 64 (or --batches) with drafting on at every one of them
(max_batch_size = the largest batch), then one summary line per workload: the largest batch at which speculation
still pays (speedup > 1), the max_batch_size to configure for this model and GPU.

Draft models: --draft-model DIR is a real draft (same tokenizer as --model): the only runs whose acceptance rate
and speedup mean anything. --draft-shape SHAPE writes a random draft checkpoint of that shape (seed 1, the
target's vocabulary): a random draft agrees with the target by chance only, so its run measures what drafting
costs when nearly nothing is accepted: with adaptive lengths the sequences stop drafting after their first steps
and the steps run without the draft (near plain decoding, but for the probes); with --fixed-length, the floor.
--draft-model self makes the target its own draft: every draft is accepted, at the price of a draft as large as
the target, which checks the verification path and bounds what a perfect draft of that cost can give. Each
drafting step runs the draft's catch-up (the last 1 or 2 tokens per sequence) and its k-1 one-token decodes in
CUDA graphs; the small-batch figures include both.

Workloads (greedy, ignore_eos, --max-tokens outputs per sequence):
- repetitive: with a real model, prompts that ask to repeat a given code block; with --random-weights, prompts
  of a repeated random token pattern (greedy continuations of a random model keep copying such patterns);
- random: random token prompts of --prompt-len (the headline's kind of prompt).
Each run is done twice in one engine and the second is timed. ms/token = wall time / --max-tokens (per sequence).
Prints one JSON line per measure: workload, batch, spec (off / on), k, ms_per_token, speedup, acceptance rate
(accepted / drafted tokens, from SchedulerStats), mean accepted tokens per step and sequence and mean drafted tokens
per step and sequence; the engine steps of the timed run (`steps`) and, with speculation, those that verified
drafts (`draft_steps`) and what one of them cost in plain steps of the same batch (`draft_step_cost`: the run's
time less its other steps at the plain run's time per step, per drafting step, over that time per step), the
figure the draft-length policy's verify_cost and draft_token_cost model.
"""
from __future__ import annotations

import argparse
import json
import random
import time

from nv_engine import LLM, SamplingParams

CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    out = []
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
'''


def repetitive_prompts(llm: LLM, batch: int, prompt_len: int, random_weights: bool, rng: random.Random):
    vocab = llm.llm_engine.config.hf_config.vocab_size
    if random_weights:
        prompts = []
        for _ in range(batch):
            pattern = [rng.randrange(100, vocab) for _ in range(rng.randrange(8, 24))]
            prompts.append((pattern * (prompt_len // len(pattern) + 1))[:prompt_len])
        return prompts
    tokenizer = llm.get_tokenizer()
    text = f"Repeat this code exactly, renaming `values` to `xs`:\n\n{CODE}\nHere it is:\n\n"
    return [tokenizer(text)["input_ids"] for _ in range(batch)]


def random_prompts(llm: LLM, batch: int, prompt_len: int, rng: random.Random):
    vocab = llm.llm_engine.config.hf_config.vocab_size
    return [[rng.randrange(100, vocab) for _ in range(prompt_len)] for _ in range(batch)]


class StepCounter:
    """Counts an LLM's engine steps and, with speculative decoding, the steps that verified drafts, by wrapping its
    engine core's `step` and SpeculativeDecoding's `runs` (called once per step collected from real tokens)."""

    def __init__(self, llm: LLM) -> None:
        self.steps = 0
        self.draft_steps = 0
        core = llm.llm_engine.core
        step = core.step

        def counted_step():
            self.steps += 1
            return step()

        core.step = counted_step
        spec = core.speculative
        if spec is not None:
            runs = spec.runs

            def counted_runs(out, token_ids):
                self.draft_steps += out.num_draft_tokens > 0
                return runs(out, token_ids)

            spec.runs = counted_runs


def draft_step_cost(seconds: float, steps: int, draft_steps: int, plain_step_seconds: float) -> float | None:
    """A drafting step's cost in plain steps of the same batch: the run's time less its steps without drafts at
    the plain run's time per step, per drafting step, over that time (None without drafting steps)."""
    if draft_steps == 0 or plain_step_seconds <= 0.0:
        return None
    return (seconds - (steps - draft_steps) * plain_step_seconds) / draft_steps / plain_step_seconds


def timed(llm: LLM, counter: StepCounter, prompts, params) -> tuple[float, int, int, int, int]:
    """(seconds, drafted, accepted, steps, drafting steps) of the second of two runs."""
    batch = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(batch, params, use_tqdm=False)
    before = llm.llm_engine.scheduler.stats()
    steps, draft_steps = counter.steps, counter.draft_steps
    start = time.perf_counter()
    llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = llm.llm_engine.scheduler.stats()
    return (seconds, after.num_draft_tokens - before.num_draft_tokens,
            after.num_accepted_tokens - before.num_accepted_tokens, counter.steps - steps,
            counter.draft_steps - draft_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: random weights of --shape)")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--batches", default=None, help="batch sizes (default 1,8; with --sweep 1,2,4,...,64)")
    parser.add_argument("--workloads", default="repetitive,random")
    parser.add_argument("--sweep", action="store_true", help="drafting at every batch; print the crossover")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", default="5", help="num_speculative_tokens, or a comma-separated list of them")
    parser.add_argument("--fixed-length", action="store_true",
                        help="adaptive_draft_length false: the full k where the lookup finds one (draft_model: always)")
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--max-batch-size", type=int, default=32, help="speculative_config's max_batch_size")
    parser.add_argument("--large-batch", type=int, default=256, help="throughput check (0: skip)")
    parser.add_argument("--draft-model", help="method draft_model with this checkpoint ('self': the target)")
    parser.add_argument("--draft-shape", help="method draft_model with a random draft checkpoint of this shape")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

        model = str(nv_cache_dir() / f"bench-random-{args.shape}-bf16")
        write_random_checkpoint(model, args.shape, dtype="bfloat16")
    random_weights = args.model is None or args.random_weights
    ks = [int(k) for k in args.k.split(",")]
    spec = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": args.lookup_max,
            "max_batch_size": args.max_batch_size, "adaptive_draft_length": not args.fixed_length}
    draft = args.draft_model
    if args.draft_shape is not None and draft is None:
        from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

        draft = str(nv_cache_dir() / f"bench-random-{args.draft_shape}-bf16-seed1")
        write_random_checkpoint(draft, args.draft_shape, dtype="bfloat16", seed=1)
    if draft is not None:
        spec = {"method": "draft_model", "model": model if draft == "self" else draft,
                "max_batch_size": args.max_batch_size, "adaptive_draft_length": not args.fixed_length}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    batches = [int(b) for b in (args.batches or ("1,2,4,8,16,32,64" if args.sweep else "1,8")).split(",")]
    workloads = args.workloads.split(",")
    if args.sweep:                 # drafting at every batch size measured
        spec["max_batch_size"] = max(batches)
    results: dict[tuple[str, int, str], float] = {}
    plain_step_seconds: dict[tuple[str, int], float] = {}
    runs = [("off", None)] + [(f"k={k}", {**spec, "num_speculative_tokens": k}) for k in ks]
    for label, speculative_config in runs:
        llm = LLM(model, speculative_config=speculative_config, max_model_len=args.prompt_len + args.max_tokens + 64)
        counter = StepCounter(llm)
        for workload in workloads:
            for batch in batches:
                rng = random.Random(batch)
                prompts = (repetitive_prompts(llm, batch, args.prompt_len, random_weights, rng)
                           if workload == "repetitive" else random_prompts(llm, batch, args.prompt_len, rng))
                seconds, drafted, accepted, steps, draft_steps = timed(llm, counter, prompts, params)
                ms = 1000 * seconds / args.max_tokens
                results[(workload, batch, label)] = ms
                line = {"workload": workload, "batch": batch, "spec": label, "ms_per_token": round(ms, 4),
                        "steps": steps}
                if speculative_config is None:
                    plain_step_seconds[(workload, batch)] = seconds / max(steps, 1)
                else:
                    cost = draft_step_cost(seconds, steps, draft_steps, plain_step_seconds[(workload, batch)])
                    line.update(draft_steps=draft_steps, draft_step_cost=None if cost is None else round(cost, 3))
                    line.update(spec="on", k=speculative_config["num_speculative_tokens"], method=spec["method"])
                    line["speedup"] = round(results[(workload, batch, "off")] / ms, 3)
                    line["acceptance_rate"] = round(accepted / drafted, 3) if drafted else 0.0
                    steps = batch * args.max_tokens - accepted
                    line["accepted_per_step"] = round(accepted / max(steps, 1), 3)
                    line["drafted_per_step"] = round(drafted / max(steps, 1), 3)
                print(json.dumps(line), flush=True)
        if args.large_batch:
            rng = random.Random(0)
            prompts = random_prompts(llm, args.large_batch, args.prompt_len, rng)
            seconds, drafted, *_ = timed(llm, counter, prompts, params)
            tokens_per_s = args.large_batch * args.max_tokens / seconds
            results[("large", args.large_batch, label)] = tokens_per_s
            line = {"workload": "random", "batch": args.large_batch, "spec": label,
                    "output_tokens_per_s": round(tokens_per_s, 1), "drafted": drafted}
            if speculative_config is not None:
                line.update(spec="on", k=speculative_config["num_speculative_tokens"], method=spec["method"])
                line["throughput_ratio"] = round(tokens_per_s / results[("large", args.large_batch, "off")], 4)
            print(json.dumps(line), flush=True)
        llm.shutdown()
    if args.sweep:
        for workload in workloads:
            for k in ks:
                speedups = {b: results[(workload, b, "off")] / results[(workload, b, f"k={k}")] for b in batches}
                paying = [b for b in batches if speedups[b] > 1.0]
                print(json.dumps({"workload": workload, "k": k, "crossover": "largest batch with speedup > 1",
                                  "max_batch_size": max(paying) if paying else 0,
                                  "speedups": {str(b): round(v, 3) for b, v in speedups.items()}}), flush=True)


if __name__ == "__main__":
    main()
