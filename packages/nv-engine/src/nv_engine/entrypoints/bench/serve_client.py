"""One worker process of `nv bench serve` (started with WORKER_BOOTSTRAP): an asyncio loop with one
aiohttp.ClientSession that streams its share of the requests (SSE) at their arrival times, at most
`max_concurrency` at a time, and records what it saw of each (serve_types.RequestRecord).
aiohttp, not httpx: reading a stream costs httpx several times the CPU per chunk (measured with a
profiler: a worker streaming 256 requests spent 75% of its time in httpx's read path), and a
worker busy reading its first answers sends its later requests late, which reads as server TTFT.

Timing. TTFT is the time to the first chunk that carries output; E2E latency the time to the last
chunk. The requests ask for `stream_options: {include_usage, continuous_usage_stats}` (vLLM's), so a
server that supports it sends the completion tokens so far in every chunk, and a chunk's new tokens
are the difference to the previous chunk's count. Then the ITL is per token: a chunk of k tokens
that came g seconds after the previous one adds k entries of g / k (as SGLang's bench_serving does
for multi-token chunks; vLLM's benchmark instead adds one ITL per chunk and counts tokens only from
the final usage, so a multi-token chunk reads as one long gap). Tokens that come in the first chunk
with the first token add gaps of 0, so a request of N tokens has N - 1 ITLs. A server without
per-chunk usage gets one ITL per chunk, and the result says "per chunk" (TPOT then divides by the
chunks after the first); its output token count is the final usage (include_usage) or the chunks.
"""
from __future__ import annotations

import asyncio
import json
import pickle
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from nv_engine.entrypoints.bench.serve_types import BenchServeRequest, ClientSettings, RequestRecord

if TYPE_CHECKING:
    import aiohttp

# `python -c WORKER_BOOTSTRAP`: a worker process that imports only this module, serve_types and
# aiohttp. The nv_engine package's __init__ loads torch (seconds per process, far more on a busy machine),
# so the package is registered without running it (its __path__ only), then this module runs.
WORKER_BOOTSTRAP = """
import importlib.util, sys, types
for name in ("nv_engine", "nv_engine.entrypoints"):
    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = package
from nv_engine.entrypoints.bench.serve_client import BenchServeClient
BenchServeClient.serve_pipes(sys.stdin.buffer, sys.stdout.buffer)
"""


class BenchServeClient:
    """Sends `requests[i]` at `arrivals[i]` seconds after the start (with at most max_concurrency open)."""

    def __init__(self, settings: ClientSettings, indices: list[int], requests: list[BenchServeRequest],
                 arrivals: list[float], max_concurrency: int | None) -> None:
        self.settings = settings
        self.indices, self.requests, self.arrivals = indices, requests, arrivals
        self.max_concurrency = max_concurrency

    @staticmethod
    def serve_pipes(stdin: BinaryIO, stdout: BinaryIO) -> None:
        """A worker process's main: read a pickled BenchServeClient, connect, write b"ready\\n", wait for
        b"go\\n", run, write the pickled list of RequestRecords."""
        client = pickle.load(stdin)
        if not isinstance(client, BenchServeClient):
            raise TypeError(f"a bench worker needs a BenchServeClient, got {type(client).__name__}")

        def ready_then_wait() -> None:
            stdout.write(b"ready\n")
            stdout.flush()
            if stdin.readline().strip() != b"go":
                raise RuntimeError("the bench parent went away before the start")

        try:
            records = asyncio.run(client.run(ready_then_wait))
        except Exception as exc:   # the parent must hear of it, not wait forever
            print(f"bench worker failed: {exc!r}", file=sys.stderr)
            records = [RequestRecord(i, error=f"worker failed: {exc!r}") for i in client.indices]
        pickle.dump(records, stdout)
        stdout.flush()

    async def run(self, wait_for_start: Callable[[], None] | None = None) -> list[RequestRecord]:
        import aiohttp

        limit = self.max_concurrency or len(self.requests)
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout_s, sock_connect=60.0)
        # read_bufsize: the largest line (one SSE event) the stream reader takes whole
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as http:
            if wait_for_start is not None:   # blocking: nothing else runs on this loop yet
                wait_for_start()
            t0 = time.monotonic()
            gate = asyncio.Semaphore(limit)
            tasks = []
            for index, request, arrival in zip(self.indices, self.requests, self.arrivals, strict=True):
                delay = arrival - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._send_when_free(http, gate, index, request)))
            return list(await asyncio.gather(*tasks))

    async def _send_when_free(self, http: aiohttp.ClientSession, gate: asyncio.Semaphore, index: int,
                              request: BenchServeRequest) -> RequestRecord:
        async with gate:
            return await self.send(http, index, request)

    def payload(self, request: BenchServeRequest) -> dict:
        s = self.settings
        body: dict = {"model": s.model, "max_tokens": request.output_len, "temperature": s.temperature,
                      "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if s.chat:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if s.ignore_eos:
            body["ignore_eos"] = True
        if request.extra_body:
            body.update(request.extra_body)
        return body

    async def send(self, http: aiohttp.ClientSession, index: int, request: BenchServeRequest) -> RequestRecord:
        """Stream one request; a failure (HTTP error, error event, no output) is recorded, never raised."""
        record = RequestRecord(index, prompt_len=request.prompt_len or 0)
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        record.start = time.monotonic()
        try:
            async with http.post(self.settings.url, json=self.payload(request), headers=headers) as resp:
                if resp.status != 200:
                    body = (await resp.read()).decode(errors="replace")
                    record.error = f"HTTP {resp.status}: {body[:500]}"
                    return record
                await self._read_events(resp, record)
        except Exception as exc:   # connection errors and the like: a failed request
            record.error = f"{type(exc).__name__}: {exc}"
        return record

    async def _read_events(self, resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
        last_time = record.start
        tokens_so_far = 0             # completion tokens per the chunks' usage
        chunk_usage_seen = False
        final_tokens: int | None = None
        async for line in resp.content:         # lines, b"\n" included
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.monotonic()
            event = json.loads(data)
            if "error" in event:
                record.error = str(event["error"].get("message", event["error"]))
                return
            usage = event.get("usage") or None
            choices = event.get("choices") or []
            if usage is not None:
                record.prompt_len = int(usage.get("prompt_tokens") or record.prompt_len)
            if not choices:                       # the final usage chunk
                if usage is not None:
                    final_tokens = int(usage.get("completion_tokens") or 0)
                continue
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") if self.settings.chat else choice.get("text")
            if usage is not None:
                chunk_usage_seen = True
                new_tokens = int(usage.get("completion_tokens") or 0) - tokens_so_far
            else:
                new_tokens = 1 if text else 0
            if new_tokens <= 0:                   # a role or finish chunk: no output in it
                continue
            tokens_so_far += new_tokens
            gap = now - last_time
            if record.num_chunks == 0:
                record.ttft = gap
                record.itl.extend([0.0] * (new_tokens - 1) if chunk_usage_seen else [])
            elif chunk_usage_seen:
                record.itl.extend([gap / new_tokens] * new_tokens)
            else:
                record.itl.append(gap)
            record.num_chunks += 1
            last_time = now
        if record.num_chunks == 0:
            record.error = record.error or "the stream ended without output"
            return
        record.per_token = chunk_usage_seen
        record.output_tokens = final_tokens if final_tokens is not None else tokens_so_far
        record.e2el = last_time - record.start
        record.success = True
