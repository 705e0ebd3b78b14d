"""AsyncEngine: a server engine in process, an LLMEngine stepped by one thread of the server.

`nv serve` runs on AsyncLLM (the engine core in its own process, so the model never shares an
interpreter with HTTP work); this in-process form serves an LLMEngine handed to `build_state`
directly (tests inject faults into its `step`, and read its scheduler). Both give the handlers the
same face: add_requests -> OutputStream, abort, fail_all_requests, is_alive, start, shutdown.

HTTP handlers never touch the engine. They send commands (add / abort) through a thread-safe queue and
read their outputs from a per-request asyncio queue that the engine thread fills with
`loop.call_soon_threadsafe` once per step. So the event loop never waits on the model, and all
requests share one continuous batch.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nv_engine.engine.output_queue import OutputQueue
from nv_engine.engine.output_stream import OutputStream
from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.metrics import ServerMetrics

__all__ = ["AsyncEngine", "OutputStream", "RequestStream"]

logger = logging.getLogger("nv_engine.entrypoints.server")


@dataclass
class RequestStream:
    """Engine-thread bookkeeping of one engine request; its outputs go to `queue` (which the
    requests of one HTTP call share)."""

    request_id: str
    queue: OutputQueue                   # of RequestOutput | BaseException
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    last_token_time: float = 0.0
    tokens_by_index: dict[int, int] = field(default_factory=dict)


class AsyncEngine:
    """Runs `engine.step()` in a dedicated thread while any request is unfinished."""

    def __init__(self, engine: Any, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_step_batch_size = 0          # the widest step seen (requests with output in it)
        self.dead: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, RequestStream] = {}     # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._cuda_device = _current_cuda_device()    # the engine's; a new thread starts on 0

    # ------------------------------------------------------------------ called on the event loop
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="nv-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stop = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self.dead is None and self._thread is not None and self._thread.is_alive()

    async def add_requests(self, requests: list[tuple[str, Any, Any]], *, stream: bool = True) -> OutputStream:
        """Queue (request_id, prompt, params) requests; returns once the engine accepted all of
        them (`stream`, AsyncLLM's hint that only finished outputs are read, changes nothing here).
        The engine's error for one of them (ValueError for a bad prompt or bad sampling values)
        propagates, and then none of them stays in the engine."""
        if not self.is_alive:
            raise APIError("The engine is not running.", status=503)
        if self._loop is None:  # is_alive implies a loop; kept explicit for the type checker and -O
            raise APIError("The engine is not running.", status=503)
        out_queue = OutputQueue()
        accepted = []
        for request_id, prompt, params in requests:
            fut = self._loop.create_future()
            request_stream = RequestStream(request_id, out_queue)
            self._commands.put(("add", request_id, prompt, params, request_stream, fut))
            accepted.append(fut)
        self._wakeup.set()
        ids = [r[0] for r in requests]
        try:
            results = await asyncio.gather(*accepted, return_exceptions=True)
        except asyncio.CancelledError:   # the client left while its requests were queued
            for request_id in ids:
                self.abort(request_id)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for request_id in ids:
                self.abort(request_id)
            raise errors[0]
        return OutputStream(self, ids, out_queue)

    def fail_all_requests(self, error: APIError) -> None:
        """End every request in flight with `error` (shutdown); their KV blocks are freed."""
        self._commands.put(("fail_all", error))
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        """Abort a request (idempotent; unknown ids are ignored). Its KV blocks are freed."""
        self._commands.put(("abort", request_id))
        self._wakeup.set()

    # ----------------------------------------------------------------------- the engine thread
    def _run(self) -> None:
        try:
            if self._cuda_device is not None:
                sys.modules["torch"].cuda.set_device(self._cuda_device)
            while not self._stop:
                if not self.engine.has_unfinished_requests():
                    self._wakeup.wait()
                self._wakeup.clear()
                self._process_commands()
                if self._stop:
                    break
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    self._deliver(outputs)
                self._update_gauges()
        except BaseException as exc:   # a dead engine: fail every request, stay unhealthy
            logger.exception("engine loop failed")
            self.dead = exc
            self._fail_all(APIError(f"The engine failed: {exc!r}", status=500))
            self._reject_pending_adds()
            return
        self._fail_all(APIError("The server is shutting down.", status=503))
        self._reject_pending_adds()

    def _queued_commands(self) -> Iterator[tuple[Any, ...]]:
        """Take the queued commands, oldest first, until the queue is empty."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            yield cmd

    def _process_commands(self) -> None:
        for cmd in self._queued_commands():
            if cmd[0] == "add":
                _, request_id, prompt, params, stream, accepted = cmd
                try:
                    self.engine.add_request(request_id, prompt, params)
                except Exception as exc:  # the request's own fault: ValueError / TypeError
                    self._call_soon(_resolve, accepted, exc)
                    continue
                self._streams[request_id] = stream
                self._call_soon(_resolve, accepted, None)
            elif cmd[0] == "fail_all":
                for request_id in list(self._streams):
                    self.engine.abort_request(request_id)
                self._fail_all(cmd[1])
            else:
                _, request_id = cmd
                if self._streams.pop(request_id, None) is not None:
                    self.engine.abort_request(request_id)

    def _reject_pending_adds(self) -> None:
        for cmd in self._queued_commands():
            if cmd[0] == "add":
                self._call_soon(_resolve, cmd[5], APIError("The engine is not running.", status=503))

    def _deliver(self, outputs: list[Any]) -> None:
        now = time.monotonic()
        batch: list[tuple[RequestStream, Any]] = []
        if outputs:
            self.max_step_batch_size = max(self.max_step_batch_size, len(outputs))
        m = self.metrics
        if m is not None and outputs:
            m.step_batch_size.observe(len(outputs))
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:       # aborted meanwhile
                continue
            new_tokens = 0
            for comp in out.outputs:
                count = len(comp.token_ids) + (stream.tokens_by_index.get(comp.index, 0) if out.delta else 0)
                new_tokens += count - stream.tokens_by_index.get(comp.index, 0)
                stream.tokens_by_index[comp.index] = count
            if m is not None and new_tokens > 0:
                if stream.first_token_time is None:
                    m.time_to_first_token.observe(now - stream.arrival_time)
                    m.prompt_tokens.inc(len(out.prompt_token_ids or ()))
                else:
                    m.time_per_output_token.observe((now - stream.last_token_time) / new_tokens)
                m.generation_tokens.inc(new_tokens)
            if new_tokens > 0:
                stream.first_token_time = stream.first_token_time or now
                stream.last_token_time = now
            if out.finished:
                del self._streams[out.request_id]
                if m is not None:
                    m.e2e_request_latency.observe(now - stream.arrival_time)
                    reason = out.outputs[0].finish_reason if out.outputs else "abort"
                    m.request_finished(str(reason))     # once per request, as vLLM counts
            batch.append((stream, out))
        if batch:
            self._call_soon(_put_all, batch)

    def _fail_all(self, exc: BaseException) -> None:
        streams, self._streams = list(self._streams.values()), {}
        if streams:
            self._call_soon(_put_all, [(s, exc) for s in streams])

    def _update_gauges(self) -> None:
        if self.metrics is None:
            return
        stats = self.stats()
        self.metrics.num_requests_running.set(stats["num_running"])
        self.metrics.num_requests_waiting.set(stats["num_waiting"])
        self.metrics.kv_cache_usage_perc.set(stats["kv_cache_usage"])

    def stats(self) -> dict[str, float]:
        """Scheduler figures (read-only; safe to call from any thread for monitoring)."""
        sched = getattr(self.engine, "scheduler", None)
        bm = getattr(sched, "block_manager", None)
        return {
            "num_running": getattr(sched, "num_running", 0),
            "num_waiting": getattr(sched, "num_waiting", 0),
            "kv_cache_usage": float(getattr(bm, "usage", 0.0)),
        }

    def _call_soon(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:   # loop closed between the check and the call
                pass


def _current_cuda_device() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def _resolve(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():               # the waiting handler was cancelled
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def _put_all(batch: list[tuple[RequestStream, Any]]) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)
