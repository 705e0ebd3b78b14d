#!/usr/bin/env python3
"""Load test for `nv serve`: streaming /v1/completions requests at a fixed concurrency; reports TTFT,
inter-token latency (ITL), time per output token (TPOT) and end-to-end latency percentiles, and
throughput. Client: stdlib asyncio only (HTTP/1.1 + SSE), so it runs where httpx is not installed.

  # against a running server
  python benchmarks/load_test.py --url http://127.0.0.1:8000
  # start the server itself on a model dir, or on a random-weight checkpoint of a known shape
  python benchmarks/load_test.py --model /path/to/dir -- --dtype bfloat16
  python benchmarks/load_test.py --random-weights --shape qwen3-0.6b --num-requests 256 --concurrency 64

Arguments after `--` go to the server (`python -m nv_engine.entrypoints.server MODEL ...`).
Workload (like the headline benchmark in BENCHMARKS.md, smaller outputs by default): random prompt token ids in
[0, 10000), lengths uniform in --input-len, max_tokens uniform in --output-len, ignore_eos,
temperature 0.6; seeded, so runs are comparable.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    chunk_gaps: list[float] = field(default_factory=list)   # ITL: gaps between token-carrying chunks
    prompt_tokens: int = 0
    output_tokens: int = 0


async def _read_body(reader: asyncio.StreamReader, chunked: bool):
    """Yield the raw body in pieces (chunked transfer encoding or read-to-EOF)."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        return
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def stream_completion(host: str, port: int, payload: dict, api_key: str | None) -> RequestResult:
    res = RequestResult()
    body = json.dumps(payload).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        buf, last = b"", None
        async for data in _read_body(reader, chunked):
            if status != 200:
                res.error += data.decode(errors="replace")
                continue
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                chunk = json.loads(event[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    res.error = chunk["error"].get("message", "error")
                elif chunk.get("choices"):
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.chunk_gaps.append(now - last)
                    last = now
                elif chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
        res.latency = time.perf_counter() - start
        res.ok = status == 200 and not res.error and last is not None
        if status != 200:
            res.error = f"HTTP {status}: {res.error[:200]}"
    finally:
        writer.close()
    return res


def make_workload(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    lo_in, hi_in = args.input_len
    lo_out, hi_out = args.output_len
    payloads = []
    for i in range(args.num_requests):
        prompt = [rng.randint(0, args.prompt_vocab - 1) for _ in range(rng.randint(lo_in, hi_in))]
        payloads.append({"model": args.served_model_name, "prompt": prompt,
                         "max_tokens": rng.randint(lo_out, hi_out), "temperature": args.temperature,
                         "ignore_eos": True, "seed": args.seed + i, "stream": True,
                         "stream_options": {"include_usage": True}})
    return payloads


async def run_load(host: str, port: int, payloads: list[dict], concurrency: int,
                   api_key: str | None) -> tuple[list[RequestResult], float]:
    gate = asyncio.Semaphore(concurrency)

    async def one(p: dict) -> RequestResult:
        async with gate:
            try:
                return await stream_completion(host, port, p, api_key)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                return RequestResult(error=repr(exc))

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in payloads))
    return list(results), time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(results: list[RequestResult], wall: float, args: argparse.Namespace) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    series = {
        "ttft_ms": [r.ttft * 1e3 for r in ok],
        "itl_ms": [g * 1e3 for r in ok for g in r.chunk_gaps],
        "tpot_ms": [(r.latency - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1],
        "e2e_s": [r.latency for r in ok],
    }
    summary = {
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "concurrency": args.concurrency, "wall_s": round(wall, 3),
        "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "requests_per_s": round(len(ok) / wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "total_tokens_per_s": round((in_tokens + out_tokens) / wall, 1),
    }
    for name, values in series.items():
        for q in (50, 90, 99):
            summary[f"{name}_p{q}"] = round(percentile(values, q), 3)
        summary[f"{name}_mean"] = round(sum(values) / len(values), 3) if values else float("nan")
    errors = [r.error for r in results if not r.ok][:5]
    if errors:
        summary["first_errors"] = errors
    return summary


def print_summary(s: dict) -> None:
    print(f"requests: {s['completed']}/{s['num_requests']} ok at concurrency {s['concurrency']}, "
          f"wall {s['wall_s']:.2f} s")
    print(f"Throughput: {s['requests_per_s']:.2f} requests/s, {s['total_tokens_per_s']:.1f} total tokens/s, "
          f"{s['output_tokens_per_s']:.1f} output tokens/s")
    print(f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_s"):
        print(f"{name:<10}" + "".join(f"{s[f'{name}_{k}']:>10.2f}" for k in ("mean", "p50", "p90", "p99")))
    server = {k: v for k, v in s.items() if k.startswith("server_")}
    if server:
        print("server side (from /metrics): " + ", ".join(f"{k[7:]} {v}" for k, v in server.items()))
    for err in s.get("first_errors", []):
        print("error:", err)


def scrape_metrics(url: str) -> dict[str, float]:
    """Sums of the server's Prometheus samples by name (labels folded), {} when unavailable."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            if 'le="' not in name_labels:
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def server_side(before: dict[str, float], after: dict[str, float]) -> dict:
    """Means over the run from the server's histograms (no client or network time in them)."""
    out = {}
    for key, metric, scale in (("server_ttft_ms_mean", "vllm:time_to_first_token_seconds", 1e3),
                               ("server_tpot_ms_mean", "vllm:inter_token_latency_seconds", 1e3),
                               ("server_e2e_s_mean", "vllm:e2e_request_latency_seconds", 1.0),
                               ("server_step_batch_mean", "nv:step_batch_size", 1.0)):
        count = after.get(metric + "_count", 0.0) - before.get(metric + "_count", 0.0)
        total = after.get(metric + "_sum", 0.0) - before.get(metric + "_sum", 0.0)
        if count > 0:
            out[key] = round(total / count * scale, 3)
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    """Until url's /health answers 200; SystemExit if proc exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode} during startup")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} was not healthy after {timeout:.0f} s")


def start_server(model: str, args: argparse.Namespace, server_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "nv_engine.entrypoints.server", model, "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", args.served_model_name, "--uvicorn-log-level", "warning", *server_args]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    print("starting:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd)
    return proc, f"http://127.0.0.1:{port}"


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    server_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    src.add_argument("--model", help="model dir: start `python -m nv_engine.entrypoints.server` on it")
    src.add_argument("--random-weights", action="store_true",
                     help="write a random-weight checkpoint of --shape (with a tokenizer) and serve it")
    p.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b or tiny (with --random-weights)")
    p.add_argument("--checkpoint-dir", default=None, help="where --random-weights writes (default: a temp dir)")
    p.add_argument("--served-model-name", default="nv-load")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(100, 512), metavar=("MIN", "MAX"))
    p.add_argument("--prompt-vocab", type=int, default=10000, help="prompt ids are drawn from [0, this)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=None,
                   help="short requests sent at full concurrency first, not counted (default: --concurrency)")
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--result-json", default=None, help="also write the summary here")
    return p.parse_args(argv), server_args



# Random-weight checkpoints for --random-weights: the model's weights are random, but its tokenizer covers the
# whole vocabulary, so detokenization costs what it would with a real model.
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
           "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def full_vocab_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with exactly `vocab_size` ids (bytes, then byte pairs, then
    triples, then the ChatML specials last), so every id a random model emits decodes to text and
    the server's detokenization costs what it would with a real vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    regular = vocab_size - len(_SPECIALS)
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    pairs = [a + b for a in alphabet for b in alphabet]
    candidates = ((p[0], p[1]) for p in pairs)
    triples = ((p, c) for p in pairs for c in alphabet)
    for left, right in (*candidates, *triples):
        if len(vocab) >= regular:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    for s in _SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=_SPECIALS[0], pad_token=_SPECIALS[0],
                                   additional_special_tokens=list(_SPECIALS[1:]))
    fast.chat_template = _CHATML
    return fast


def write_load_test_checkpoint(out_dir: str | Path, shape: str = "qwen3-0.6b", seed: int = 0) -> Path:
    """nv_engine.model_loader.random_model's random-weight Qwen3 checkpoint (bf16) plus a full-vocabulary
    tokenizer. Reuses the dir when it already holds one."""
    from transformers import AutoConfig

    from nv_engine.model_loader.random_model import write_random_checkpoint

    out = Path(out_dir)
    if not ((out / "model.safetensors").exists() and (out / "tokenizer.json").exists()):
        write_random_checkpoint(out, shape, dtype="bfloat16", seed=seed, with_tokenizer=False)
        full_vocab_tokenizer(AutoConfig.from_pretrained(out).vocab_size).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args, server_args = parse_args(sys.argv[1:] if argv is None else argv)
    proc = None
    tmp = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            model = args.model
            if args.random_weights:
                if args.checkpoint_dir is None:
                    tmp = tempfile.TemporaryDirectory(prefix="nv-load-ckpt-")
                model = str(write_load_test_checkpoint(Path(args.checkpoint_dir or tmp.name), args.shape))
            config = Path(model) / "config.json"
            if config.exists():   # prompt ids must lie inside the model's vocabulary
                vocab = json.loads(config.read_text()).get("vocab_size", args.prompt_vocab)
                args.prompt_vocab = min(args.prompt_vocab, vocab)
            proc, url = start_server(model, args, server_args)
        wait_healthy(url, proc, args.startup_timeout)
        host, port = url.split("://", 1)[1].rsplit(":", 1)
        payloads = make_workload(args)
        warmup = args.concurrency if args.warmup is None else args.warmup
        if warmup:   # the first burst of connections pays one-time costs (lazy imports, pools)
            warm = [dict(p, max_tokens=4) for p in (payloads * 2)[:warmup]]
            asyncio.run(run_load(host, int(port), warm, args.concurrency, args.api_key))
        before = scrape_metrics(url)
        results, wall = asyncio.run(run_load(host, int(port), payloads, args.concurrency, args.api_key))
        summary = summarize(results, wall, args)
        summary.update(server_side(before, scrape_metrics(url)))
        print_summary(summary)
        if args.result_json:
            Path(args.result_json).write_text(json.dumps(summary, indent=2))
        return 0 if summary["failed"] == 0 else 1
    finally:
        if proc is not None:
            stop_server(proc)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
