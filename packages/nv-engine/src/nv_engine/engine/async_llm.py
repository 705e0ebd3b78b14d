"""AsyncLLM: the asyncio API over an engine core in its own process (vLLM's AsyncLLM).

The frontend (this process) tokenizes, checks requests, detokenizes, applies stop strings and
builds RequestOutputs (OutputProcessor); the engine core (EngineCoreProcess, over ZMQ) schedules
and runs the model. So the core's loop never waits on HTTP work, tokenization or detokenization,
and those never wait on the model. A stop string that ends a running sequence is sent to the core
as a finish message (the core may compute a token or two more, dropped here).

Outputs are CUMULATIVE by default: each RequestOutput carries its request's full text and token ids so
far (every step with news, then the finished one); SamplingParams.output_kind DELTA sends only what is
new. The OutputProcessor runs in the receiver thread (off the asyncio loop), under a lock shared with
abort; each request's outputs reach its OutputQueue through `loop.call_soon_threadsafe`, so
requests of several event loops work. Adding a request never waits for that lock (the receiver holds it
for milliseconds per step at a full batch, and a wave of arriving requests would stall the event loop
behind it): the request goes to a queue of arrivals, which whoever takes the lock next registers first.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.engine.core_client import EngineCoreClient
from nv_engine.engine.data_parallel_client import DataParallelCoreClient
from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.engine.engine_requests import Prompt, Tokenizer, eos_token_ids, load_tokenizer
from nv_engine.engine.output_processor import OutputProcessor
from nv_engine.engine.output_queue import OutputQueue
from nv_engine.engine.output_stream import OutputStream
from nv_engine.engine.outputs import RequestOutput
from nv_engine.engine.request_preparer import RequestPreparer
from nv_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Text prompts longer than this are tokenized in a worker thread (the event loop keeps answering).
_TOKENIZE_INLINE_CHARS = 2048


class StatLogger(Protocol):
    """Gets every step's statistics (called in the receiver thread, once per core step)."""

    def record(self, core_outputs: EngineCoreOutputs, request_outputs: list[RequestOutput],
               arrival_times: dict[str, float], now: float) -> None: ...

    def forget(self, request_ids: list[str]) -> None:
        """Requests that ended without a finished output (aborted, failed)."""


@dataclass(eq=False)
class _Route:
    """Where one request's outputs go: its stream's queue, on the loop that awaits it."""

    queue: OutputQueue
    loop: asyncio.AbstractEventLoop
    arrival_time: float


@dataclass(eq=False)
class _Arrival:
    """A request added but not yet registered in the OutputProcessor and the routes."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    route: _Route


class AsyncLLM:
    """`AsyncLLM(model, **kwargs)`: the keyword arguments are LLM's (EngineArgs fields). Starts the
    engine-core process and returns once it is ready (RuntimeError with the core's message if it
    failed to start).

        async for output in llm.generate(prompt, params, request_id):
            ...   # a RequestOutput, cumulative

    Leaving the loop early (break, cancellation, a closed client) aborts the request in the core.
    If the core dies every open request raises EngineDeadError, `errored` turns True and every
    later call raises EngineDeadError. With data_parallel_size > 1 each request goes to one of
    several cores (DataParallelCoreClient; the stream's `engine_indices` name them): a dead core
    fails only its own requests, and the engine is dead only when every core is."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        args = EngineArgs.from_kwargs(model, **kwargs)
        self.stat_loggers: list[StatLogger] = []
        self.max_step_batch_size = 0          # the widest step seen (requests with output in it)
        self.scheduler_stats: object | None = None   # the core's latest snapshot, if it sends one
        self.dead_error: EngineDeadError | None = None
        self._lock = threading.Lock()         # output_processor and _routes
        self._routes: dict[str, _Route] = {}
        self._arrivals: deque[_Arrival] = deque()     # appended without the lock; registered under it
        # request ids of open requests (arrived or registered): checked and updated under _ids_lock,
        # which is held only for those set operations
        self._ids_lock = threading.Lock()
        self._ids_in_use: set[str] = set()
        self._shut_down = False
        # One core starts first, from the arguments alone: it reads the model's config and tokenizer itself
        # while this process does the same (seconds of imports on both sides, run side by side);
        # wait_ready checks that both resolved the same limits and EOS ids. Data-parallel cores need the
        # config first (each gets its own devices and event endpoint).
        early: EngineCoreClient | None = None
        if args.data_parallel_size == 1:
            args = args.with_resolved_paths()     # fetched or converted once, here
            early = EngineCoreClient(args, None, on_outputs=self._on_core_outputs, on_dead=self._on_core_dead)
        reading = time.perf_counter()
        try:
            config = args.create_engine_config()
            self.config: EngineConfig = config
            self.tokenizer: Tokenizer | None = load_tokenizer(config)
            self.preparer = RequestPreparer(config, self.tokenizer)
            self.output_processor = OutputProcessor(self.tokenizer, stream_outputs=True,
                                                    stream_interval=config.stream_interval)
            eos = eos_token_ids(config, self.tokenizer)
            logger.info("read the model's config and tokenizer in %.1f s%s", time.perf_counter() - reading,
                        "" if early is None else " (the engine core started meanwhile)")
            if early is not None:
                early.wait_ready(config, eos)
        except BaseException:
            if early is not None:
                early.shutdown()
            raise
        self.client: EngineCoreClient | DataParallelCoreClient = (
            early if early is not None else
            DataParallelCoreClient(config, eos, on_outputs=self._on_core_outputs, on_dead=self._on_core_dead))
        self.num_blocks = int(self.client.ready["num_blocks"])      # over all cores
        self.core_pid = int(self.client.ready["pid"])               # the first core's
        # by engine index
        self.core_pids = self.client.pids if isinstance(self.client, DataParallelCoreClient) else [self.core_pid]
        self.core_num_blocks = (self.client.num_blocks_per_core if isinstance(self.client, DataParallelCoreClient)
                                else [self.num_blocks])

    # ---- status ------------------------------------------------------------------------------
    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        return not self._shut_down and self.dead_error is None and self.client.is_alive

    is_alive = is_running     # the server's name

    @property
    def dead_engines(self) -> dict[int, str]:
        """Engine index -> why that core died (data parallel: the others may still serve)."""
        if isinstance(self.client, DataParallelCoreClient):
            return self.client.dead_engines
        return {} if self.dead_error is None else {0: str(self.dead_error)}

    def get_tokenizer(self) -> Tokenizer | None:
        return self.tokenizer

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as token ids")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _check_running(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if not self.is_running:
            raise EngineDeadError("the engine is shut down")

    # ---- requests ----------------------------------------------------------------------------
    async def generate(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """The request's outputs as it runs (cumulative), the last one with finished=True."""
        if request_id is None:
            request_id = f"gen-{uuid.uuid4().hex}"
        stream = await self.add_requests([(request_id, prompt, sampling_params)])
        try:
            async for outputs in stream:
                for output in outputs:
                    yield output
        finally:
            stream.abort()             # closed early (break, cancellation): abort in the core

    async def add_requests(self, requests: Sequence[tuple[str, Prompt, SamplingParams | None]], *,
                           stream: bool = True) -> OutputStream:
        """Queue several requests whose outputs share one stream (the n prompts of a completion
        call). ValueError / TypeError (nothing queued) for a bad prompt, parameters or a request id
        in use. stream=False: the caller reads only the finished outputs, so the text is decoded once,
        at the end (the outputs before carry token ids and an empty text). The core still reports
        every token, which the per-token statistics (time to first token, inter-token latency) need."""
        self._check_running()
        loop = asyncio.get_running_loop()
        long_text = any(isinstance(p, str) and len(p) > _TOKENIZE_INLINE_CHARS for _, p, _ in requests)
        if long_text:
            prepared = await asyncio.to_thread(self._prepare_all, requests)
        else:
            prepared = self._prepare_all(requests)
        self._check_running()
        queue = OutputQueue()
        now = time.monotonic()
        core_requests = []
        with self._ids_lock:
            for request_id, _, _ in requests:
                if request_id in self._ids_in_use:
                    raise ValueError(f"request id {request_id!r} is already in use")
            self._ids_in_use.update(request_id for request_id, _, _ in requests)
        for (request_id, _, _), (text, ids, params) in zip(requests, prepared, strict=True):
            self._arrivals.append(_Arrival(request_id, text, ids, params, stream, _Route(queue, loop, now)))
            reports = params.needs_every_token(stream=True, detokenizes=self.tokenizer is not None)
            core_requests.append(EngineCoreRequest(request_id, ids, params, reports, now))
        try:
            engine_indices = self.client.add_requests(core_requests)
        except BaseException:
            self._forget([r.request_id for r in core_requests])
            raise
        output_stream = OutputStream(self, [r.request_id for r in core_requests], queue)
        output_stream.engine_indices = engine_indices or [0] * len(core_requests)
        return output_stream

    def _prepare_all(self, requests: Sequence[tuple[str, Prompt, SamplingParams | None]]
                     ) -> list[tuple[str | None, list[int], SamplingParams]]:
        ids = [request_id for request_id, _, _ in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        return [self.preparer.prepare(prompt, params) for _, prompt, params in requests]

    def abort(self, request_id: str) -> None:
        """Abort a request (idempotent; unknown ids are ignored); the core frees its blocks.
        Safe from any thread."""
        if self._forget([request_id]) and self.client.is_alive:
            try:
                self.client.abort_requests([request_id])
            except EngineDeadError:
                pass

    def _forget(self, request_ids: list[str]) -> bool:
        with self._lock:
            self._register_arrivals()
            found = [self._routes.pop(rid, None) is not None for rid in request_ids]
            self.output_processor.abort_requests(request_ids)
        self._release_ids([rid for rid, was_open in zip(request_ids, found, strict=True) if was_open])
        self._forget_stats(request_ids)
        return any(found)

    def _register_arrivals(self) -> None:
        """Under self._lock: the requests added since, into the OutputProcessor and the routes (in order,
        so before any of their outputs: a request reaches the core only after its arrival is queued)."""
        arrivals = self._arrivals
        while arrivals:
            a = arrivals.popleft()
            self.output_processor.add_request(a.request_id, a.prompt, a.prompt_token_ids, a.params, stream=a.stream)
            self._routes[a.request_id] = a.route

    def _release_ids(self, request_ids: list[str]) -> None:
        if request_ids:
            with self._ids_lock:
                self._ids_in_use.difference_update(request_ids)

    def _forget_stats(self, request_ids: list[str]) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.forget(request_ids)

    def fail_all_requests(self, error: BaseException) -> None:
        """End every open request with `error` (the server's drain timeout); the core aborts them."""
        with self._lock:
            self._register_arrivals()
            routes, self._routes = self._routes, {}
            self.output_processor.abort_requests(list(routes))
        self._release_ids(list(routes))
        self._forget_stats(list(routes))
        if routes and self.client.is_alive:
            try:
                self.client.abort_requests(list(routes))
            except EngineDeadError:
                pass
        self._deliver([(route, error) for route in routes.values()])

    async def call_utility(self, method: str, *args: int) -> int:
        """An EngineCore utility (get_num_free_blocks, get_num_unfinished_requests) run in the core."""
        self._check_running()
        return await asyncio.wrap_future(self.client.call_utility(method, *args))

    # ---- the receiver thread -----------------------------------------------------------------
    def _on_core_outputs(self, core_outputs: EngineCoreOutputs) -> None:
        deliveries: list[tuple[_Route, RequestOutput | BaseException]] = []
        ended: list[str] = []
        with self._lock:
            self._register_arrivals()
            processed = self.output_processor.process(core_outputs.updates)
            routes = self._routes
            arrivals: dict[str, float] = {}
            for output in processed.request_outputs:
                route = routes.get(output.request_id)
                if route is None:
                    continue                    # aborted meanwhile
                if output.finished:
                    del routes[output.request_id]
                    ended.append(output.request_id)
                arrivals[output.request_id] = route.arrival_time
                deliveries.append((route, output))
            for request_id, message in core_outputs.failed:
                route = routes.pop(request_id, None)
                self.output_processor.abort_requests([request_id])
                if route is not None:
                    ended.append(request_id)
                    deliveries.append((route, ValueError(message)))
            failed = [request_id for request_id, _ in core_outputs.failed]
        self._release_ids(ended)
        if processed.to_finish:
            try:
                self.client.finish_requests(processed.to_finish)
            except EngineDeadError:
                pass
        delivering = time.perf_counter()
        self._deliver(deliveries)
        self.client.note_delivery(core_outputs.engine_index, time.perf_counter() - delivering)
        if failed:
            self._forget_stats(failed)
        self.record_stats(core_outputs, processed.request_outputs, arrivals)

    def record_stats(self, core_outputs: EngineCoreOutputs, request_outputs: list[RequestOutput],
                     arrival_times: dict[str, float]) -> None:
        """The one place where a step's statistics go: the core's scheduler snapshot and per-request
        times (arrival here, first scheduled and step time in core_outputs) to every stat logger."""
        if request_outputs:
            self.max_step_batch_size = max(self.max_step_batch_size, len(request_outputs))
        if core_outputs.scheduler_stats is not None:
            self.scheduler_stats = core_outputs.scheduler_stats
        now = time.monotonic()
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(core_outputs, request_outputs, arrival_times, now)
            except Exception:
                logger.exception("a stat logger failed")

    def _on_core_dead(self, reason: str, request_ids: list[str] | None = None) -> None:
        """The engine died (request_ids None: every request fails, and every later call), or one
        data-parallel core did (only its requests fail)."""
        error = EngineDeadError(reason)
        with self._lock:
            self._register_arrivals()
            if request_ids is None:
                self.dead_error = error
                routes, self._routes = self._routes, {}
            else:
                routes = {rid: route for rid in request_ids if (route := self._routes.pop(rid, None)) is not None}
            self.output_processor.abort_requests(list(routes))
        self._release_ids(list(routes))
        self._forget_stats(list(routes))
        self._deliver([(route, error) for route in routes.values()])

    @staticmethod
    def _deliver(deliveries: list[tuple[_Route, RequestOutput | BaseException]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputQueue, RequestOutput | BaseException]]] = {}
        for route, item in deliveries:
            by_loop.setdefault(route.loop, []).append((route.queue, item))
        for loop, items in by_loop.items():
            if loop.is_closed():
                continue                      # nobody waits on a closed loop
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:              # closed between the check and the call
                pass

    # ---- the server's lifecycle hooks ----------------------------------------------------------
    def start(self) -> None:
        """Nothing to start: the core runs from construction (the server calls this at startup)."""

    def stats(self) -> dict[str, float]:
        """The scheduler's latest figures the core sent (zeros before any)."""
        snapshot = self.scheduler_stats
        return {"num_running": float(getattr(snapshot, "num_running", 0)),
                "num_waiting": float(getattr(snapshot, "num_waiting", 0)),
                "kv_cache_usage": float(getattr(snapshot, "kv_cache_usage", 0.0))}

    def shutdown(self) -> None:
        """Stop the core (open requests end with EngineDeadError). Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self.fail_all_requests(EngineDeadError("the engine is shut down"))
        self.client.shutdown()

    def __enter__(self) -> AsyncLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _put_all(items: list[tuple[OutputQueue, RequestOutput | BaseException]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
