"""`nv bench serve`: load an OpenAI-compatible server (nv serve, vLLM, ...) the way `vllm bench serve`
does and report TTFT, TPOT, ITL and E2E latency and the throughput, as a table and a JSON file.

The client is never the bottleneck: the requests are dealt round-robin to several worker processes
(serve_client.BenchServeClient; they import aiohttp, not torch), each an asyncio loop with one
aiohttp session, started together once every worker is ready. Arrival
times are drawn once for the whole run (Poisson at --request-rate, or all at once) and
--max-concurrency is split across the workers. The requests carry only OpenAI fields and vLLM's
`ignore_eos` (with --ignore-eos) and `stream_options.continuous_usage_stats`.
Default dataset: the requests of `nv bench throughput` (256 random token-id prompts of 100-1,024
tokens, 100-1,024 output tokens, temperature 0.6, ignore_eos)."""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, cast

import numpy as np

from nv_engine import envs
from nv_engine.entrypoints.bench.serve_client import WORKER_BOOTSTRAP, BenchServeClient
from nv_engine.entrypoints.bench.serve_dataset import BenchServeDataset
from nv_engine.entrypoints.bench.serve_metrics import METRICS, BenchServeMetrics
from nv_engine.entrypoints.bench.serve_types import ClientSettings, RequestRecord


def add_bench_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", help="the server's URL (default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions",
                   help="/v1/completions (token-id or text prompts) or /v1/chat/completions (text prompts)")
    p.add_argument("--model", help="the served model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=envs.openai_api_key(),
                   help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--dataset-name", choices=("headline", "random", "jsonl"), default="headline",
                   help="headline: the requests of `nv bench throughput`; random: --random-* lengths; "
                   "jsonl: text prompts from --dataset-path")
    p.add_argument("--dataset-path", help="JSONL file, one {\"prompt\": TEXT, \"max_tokens\": N} a line; a line's "
                   "\"extra_body\" object adds request fields (response_format, ignore_eos, ...)")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--max-token-id", type=int, default=10000, help="largest token id of random prompts")
    p.add_argument("--output-len", type=int, default=256, help="max_tokens of JSONL prompts that give none")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (Poisson arrivals); inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests open at once (all workers)")
    p.add_argument("--num-workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="client processes")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="send ignore_eos (default: on for the headline dataset)")
    p.add_argument("--temperature", type=float, default=None, help="default: 0.6 headline, else 0.0")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                   help=f"comma-separated, of {','.join(METRICS)}")
    p.add_argument("--metric-percentiles", default="50,90,99", help="comma-separated percentiles")
    p.add_argument("--result-file", help="write the results as JSON here")
    p.set_defaults(func=run_bench_serve_command)


def run_bench_serve_command(args: argparse.Namespace) -> int:
    run_bench_serve(args)
    return 0


def served_model(base_url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            listing = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        raise ValueError(f"GET {base_url}/v1/models answered {exc.code}: {body[:300]}") from exc
    except OSError as exc:      # URLError, refused, timed out
        raise ValueError(f"cannot reach {base_url} ({exc}): is the server up? (--base-url / --host --port)") from exc
    models = listing.get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model: pass --model")
    return str(models[0]["id"])


def load_dataset(args: argparse.Namespace) -> BenchServeDataset:
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}")
    if args.dataset_name == "headline":
        return BenchServeDataset.headline(args.num_prompts, args.seed, args.max_token_id)
    if args.dataset_name == "random":
        return BenchServeDataset.random(args.num_prompts, args.seed, args.max_token_id, args.random_input_len,
                                        args.random_output_len, args.random_range_ratio)
    if not args.dataset_path:
        raise ValueError("--dataset-name jsonl needs --dataset-path")
    return BenchServeDataset.jsonl(args.dataset_path, args.num_prompts, args.output_len)


def arrival_times(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Seconds after the start: all 0 at an infinite rate, else a Poisson process (exponential gaps)."""
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {request_rate}")
    if np.isinf(request_rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, num_requests)
    return (np.cumsum(gaps) - gaps[0]).tolist()


def run_clients(settings: ClientSettings, dataset: BenchServeDataset, arrivals: list[float],
                num_workers: int, max_concurrency: int | None) -> tuple[list[RequestRecord], float]:
    """Deal the requests round-robin to worker processes, start them together once all are ready;
    (records, seconds from the start to the last record)."""
    num = len(dataset.requests)
    workers = max(1, min(num_workers, num, max_concurrency or num))
    procs: list[tuple[subprocess.Popen, IO[bytes], IO[bytes]]] = []   # (process, its stdin, its stdout)
    try:
        for w in range(workers):
            indices = list(range(w, num, workers))
            share = None if max_concurrency is None else max_concurrency // workers + (w < max_concurrency % workers)
            client = BenchServeClient(settings, indices, [dataset.requests[i] for i in indices],
                                      [arrivals[i] for i in indices], share)
            proc = subprocess.Popen([sys.executable, "-c", WORKER_BOOTSTRAP], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
            stdin, stdout = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout)   # PIPE: both set
            procs.append((proc, stdin, stdout))
            pickle.dump(client, stdin)
            stdin.flush()
        for proc, _, stdout in procs:
            if stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a bench client worker did not start (exit code {proc.wait()})")
        t0 = time.monotonic()
        for _, stdin, _ in procs:
            stdin.write(b"go\n")
            stdin.flush()
        records: list[RequestRecord] = []
        for proc, _, stdout in procs:
            try:
                records.extend(pickle.load(stdout))
            except EOFError as exc:
                raise RuntimeError(f"a bench client worker died (exit code {proc.wait()})") from exc
        wall = time.monotonic() - t0
    finally:
        for proc, stdin, _ in procs:
            stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return records, wall


def run_bench_serve(args: argparse.Namespace) -> dict:
    try:
        import aiohttp  # noqa: F401 - the client's one dependency beyond nv's own
    except ImportError as exc:
        raise ValueError(f"nv bench serve needs aiohttp: pip install 'nv-engine[serve]' ({exc})") from exc
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    chat = args.endpoint.rstrip("/").endswith("chat/completions")
    dataset = load_dataset(args)
    if chat and dataset.has_token_prompts:
        raise ValueError(f"{args.endpoint} takes text prompts: use --dataset-name jsonl, or /v1/completions")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if args.num_workers < 1:
        raise ValueError(f"--num-workers must be at least 1, got {args.num_workers}")
    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    headline = dataset.name == "headline"
    model = args.model or served_model(base_url, args.api_key)
    settings = ClientSettings(
        url=base_url + "/" + args.endpoint.lstrip("/"), model=model, chat=chat,
        temperature=args.temperature if args.temperature is not None else (0.6 if headline else 0.0),
        ignore_eos=args.ignore_eos if args.ignore_eos is not None else headline, api_key=args.api_key)
    arrivals = arrival_times(len(dataset.requests), args.request_rate, args.seed)
    print(f"nv bench serve: {len(dataset.requests)} {dataset.name} requests to {settings.url} (model {model}), "
          f"request rate {args.request_rate}, max concurrency {args.max_concurrency}, "
          f"{args.num_workers} client workers", flush=True)
    records, wall = run_clients(settings, dataset, arrivals, args.num_workers, args.max_concurrency)
    metrics = BenchServeMetrics(records, wall, selected, percentiles)
    print(metrics.table())
    result = dict(endpoint=settings.url, model=model, dataset=dataset.name, num_prompts=len(dataset.requests),
                  request_rate=args.request_rate if np.isfinite(args.request_rate) else "inf",
                  max_concurrency=args.max_concurrency, temperature=settings.temperature,
                  ignore_eos=settings.ignore_eos, **metrics.to_dict())
    failed = [r for r in records if not r.success]
    if failed:
        print(f"{len(failed)} failed; the first: {failed[0].error}")
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result, indent=2))
    return result
