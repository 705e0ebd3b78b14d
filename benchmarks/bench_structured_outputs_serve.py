"""Structured outputs through `nv serve`: streamed JSON-schema chat requests on SmolLM2-135M-Instruct (bf16, real
weights, so the JSON ends naturally) against the same requests without a schema, as clients meet the server.

Starts `nv serve` on the model (--max-num-seqs streams at once, 64 by default), then sends the requests of
bench_structured_outputs.py (four schemas with bounded strings and arrays, chat questions) with `nv bench serve`'s
client workers (multi-process, aiohttp; `response_format: json_schema` through each request's extra_body), at most
--concurrency open at a time. Each round runs the grammar requests, then their plain twins: the same messages with
max_tokens = the grammar twin's output length and ignore_eos, so both runs decode the same lengths. Output tokens
are the server's usage counts. Prints each round's output tok/s and ratio and the median round's ratio. Before the
rounds, a few grammar requests are answered without streaming and their JSON validated against its schema.

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/bench_structured_outputs_serve.py [--gguf PATH]
        [--model DIR] [--requests 512] [--concurrency 64] [--max-tokens 256] [--rounds 3] [--port 8000]
        [--json OUT]

Needs the serve extra (FastAPI, uvicorn, aiohttp), xgrammar and jsonschema.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import jsonschema
from bench_structured_outputs import median_round, requests
from load_test import wait_healthy

from nv_engine.entrypoints.bench.serve import run_clients
from nv_engine.entrypoints.bench.serve_dataset import BenchServeDataset
from nv_engine.entrypoints.bench.serve_types import BenchServeRequest, ClientSettings
from nv_engine.model_loader.gguf import default_gguf_path

SERVED_NAME = "smollm2"


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def validated(base_url: str, batch: list[tuple[list[dict], dict]], max_tokens: int) -> int:
    """How many of these grammar requests, answered without streaming, end with "stop" and JSON that fits."""
    valid = 0
    for messages, schema in batch:
        body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                "response_format": response_format(schema)}
        request = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            choice = json.loads(response.read())["choices"][0]
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += choice["finish_reason"] == "stop"
    return valid


def timed_run(settings: ClientSettings, dataset: BenchServeDataset, concurrency: int, workers: int
              ) -> tuple[float, list[int]]:
    """(output tok/s, each request's output tokens); RuntimeError naming the first failure."""
    records, wall = run_clients(settings, dataset, [0.0] * len(dataset.requests), workers, concurrency)
    failed = [r for r in records if not r.success]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} {dataset.name} requests failed: {failed[0].error}")
    lengths = [r.output_tokens for r in sorted(records, key=lambda r: r.index)]
    return sum(lengths) / wall, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description="Structured outputs against plain requests through nv serve.")
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--model", default=None, help="an HF checkpoint directory instead of the GGUF")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64, help="streams at once (and the server's max_num_seqs)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="client worker processes")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    model = args.model or args.gguf or str(default_gguf_path())
    base_url = f"http://127.0.0.1:{args.port}"
    batch = requests(args.requests)
    server = subprocess.Popen([sys.executable, "-m", "nv_engine.entrypoints.cli", "serve", model, "--port",
                               str(args.port), "--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs",
                               str(args.concurrency), "--served-model-name", SERVED_NAME],
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        started = time.monotonic()
        wait_healthy(base_url, server, 600.0)
        start_s = time.monotonic() - started
        valid = validated(base_url, batch[:8], args.max_tokens)
        print(f"nv serve answered after {start_s:.1f} s; {valid}/8 grammar answers stopped with JSON that fits",
              flush=True)
        settings = ClientSettings(url=base_url + "/v1/chat/completions", model=SERVED_NAME, chat=True,
                                  temperature=0.0, ignore_eos=False, api_key=None)
        grammar = BenchServeDataset("json_schema", [
            BenchServeRequest(messages[0]["content"], args.max_tokens, extra_body={
                "response_format": response_format(schema)}) for messages, schema in batch])
        warm = BenchServeDataset("warm-up", grammar.requests[:16] + [
            BenchServeRequest(r.prompt, 32, extra_body={"ignore_eos": True}) for r in grammar.requests[:16]])
        timed_run(settings, warm, args.concurrency, args.workers)
        rounds = []
        for number in range(args.rounds):
            grammar_rate, lengths = timed_run(settings, grammar, args.concurrency, args.workers)
            plain = BenchServeDataset("plain", [
                BenchServeRequest(r.prompt, max(1, n), extra_body={"ignore_eos": True})
                for r, n in zip(grammar.requests, lengths, strict=True)])
            plain_rate, _ = timed_run(settings, plain, args.concurrency, args.workers)
            ratio = grammar_rate / plain_rate
            rounds.append({"round": number, "grammar_tok_per_s": round(grammar_rate, 1),
                           "plain_tok_per_s": round(plain_rate, 1), "ratio": round(ratio, 4),
                           "mean_output_len": round(sum(lengths) / len(lengths), 1)})
            print(f"round {number}: grammar {grammar_rate:,.0f} / plain {plain_rate:,.0f} output tok/s = {ratio:.3f} "
                  f"(mean output {sum(lengths) / len(lengths):.1f} tokens)", flush=True)
        median = median_round(rounds)
        print(f"median grammar / plain output tok/s over {len(rounds)} rounds: {median['ratio']:.3f} "
              f"(all: {', '.join(format(r['ratio'], '.3f') for r in rounds)})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"start_s": start_s, "valid_of_8": valid, "rounds": rounds,
                           "median_ratio": median["ratio"]}, f, indent=2)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
