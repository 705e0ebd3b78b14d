"""EngineCoreClient: the frontend's side of an engine-core process (start, send, receive, watch).

It binds two ipc:// sockets in a private temporary directory and starts EngineCoreProcess (spawned, or
forked from the forkserver: CUDA cannot be forked); `wait_ready()` then waits for its READY message; a
core that fails to start raises RuntimeError there with the core's message. The core gets either the
frontend's EngineConfig and EOS ids, or the EngineArgs alone: it then resolves both itself, the way the
frontend does, so it can start before the frontend has read the model's config and tokenizer (they
take seconds: `nv serve`'s start), and `wait_ready(config, eos_token_ids)` checks that both sides
resolved the same limits and EOS ids. A receiver thread then takes every
message the core sends and hands the step outputs to `on_outputs`; it polls the process sentinel
together with the socket, so a dead core is noticed at once (`on_dead` is called with the reason).
Sends are thread-safe (one lock around the PUSH socket).

The receiver's time per OUTPUTS message is summed by `timer` (a StageTimer, logged at DEBUG every
10 s): `decode` (the frame to EngineCoreOutputs) and `handle` (the `on_outputs` callback: AsyncLLM's
output processing, with `deliver`, the hand-over to the asyncio queues, which AsyncLLM adds).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import zmq

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_process import EngineCoreProcess
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.stage_timer import StageTimer
from nv_engine.engine.core_forkserver import CoreForkserver
from nv_engine.engine.engine_dead_error import EngineDeadError

logger = logging.getLogger(__name__)

_POLL_MS = 200      # how often the receiver thread looks at its stop flag


class EngineCoreClient:
    def __init__(self, engine: EngineConfig | EngineArgs, eos_token_ids: Iterable[int] | None, *,
                 on_outputs: Callable[[EngineCoreOutputs], None], on_dead: Callable[[str], None],
                 env: Mapping[str, str] | None = None) -> None:
        """Start the core and return at once (`wait_ready()` waits for it). engine: the resolved EngineConfig
        with eos_token_ids, or EngineArgs (model and tokenizer already resolved to local paths:
        `EngineArgs.with_resolved_paths()`) with None: the core resolves the config and EOS ids itself.
        env: environment variables for the core process only (a data-parallel core's CUDA_VISIBLE_DEVICES),
        set by the core process as it starts (this process's environment is left alone)."""
        self._on_outputs = on_outputs
        self._on_dead = on_dead
        self._send_codec = CoreMessageCodec()      # used under _send_lock
        self._receive_codec = CoreMessageCodec()   # used by the receiver thread (and before it starts)
        self.timer = StageTimer("engine core outputs", "message", ("decode", "handle", "deliver"), logger,
                                notes={"handle": "deliver"})
        self._dir = tempfile.mkdtemp(prefix="nv-core-")
        self._context = zmq.Context()
        self._input = self._context.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)          # never block a send on a slow core
        self._input.setsockopt(zmq.LINGER, 0)
        self._input.bind(f"ipc://{self._dir}/input")
        self._output = self._context.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._output.setsockopt(zmq.LINGER, 0)
        self._output.bind(f"ipc://{self._dir}/output")
        self._send_lock = threading.Lock()
        self._calls: dict[int, concurrent.futures.Future[int]] = {}
        self._call_ids = itertools.count()
        self._closing = False
        self.dead_reason: str | None = None
        self.ready: dict[str, Any] = {}          # the core's READY message, once wait_ready() returned
        self._thread: threading.Thread | None = None
        # spawned, or forked from the forkserver `nv serve` started (core_forkserver.py); either way the core
        # sets env itself (EngineCoreProcess.main), before anything reads it
        self.process = CoreForkserver.context().Process(  # pyright: ignore[reportAttributeAccessIssue]
            target=EngineCoreProcess.main, name="nv-engine-core",
            args=(engine, None if eos_token_ids is None else sorted(eos_token_ids), f"ipc://{self._dir}/input",
                  f"ipc://{self._dir}/output", logging.getLogger("nv_engine").getEffectiveLevel(), dict(env or {})))
        self._spawned = time.perf_counter()
        # Started from a thread: a forkserver answers (with the child's pid) only once its preload is done, and
        # this process has its own setup to do meanwhile (AsyncLLM reads the model's config while the core starts).
        self._start_error: BaseException | None = None
        self._starter = threading.Thread(target=self._start_process, name="nv-core-start", daemon=True)
        self._starter.start()
        # The core is not a daemon process (it may start tensor-parallel workers), and
        # multiprocessing joins such children at exit: stop it first if nobody shut it down.
        atexit.register(EngineCoreClient._shutdown_at_exit, weakref.ref(self))

    def _start_process(self) -> None:
        try:
            self.process.start()
        except BaseException as exc:      # raised by wait_ready
            self._start_error = exc

    def wait_ready(self, config: EngineConfig | None = None, eos_token_ids: Iterable[int] | None = None) -> None:
        """Wait for the core's READY, then start taking its messages. A core that resolved its own config:
        RuntimeError unless its max_model_len, block_size and EOS ids equal config's and eos_token_ids (the
        frontend checks requests against those). On any failure the core is stopped."""
        try:
            self._starter.join()
            if self._start_error is not None:
                raise RuntimeError(f"the engine core could not be started: {self._start_error!r}") \
                    from self._start_error
            self.ready = self._wait_ready()
            logger.info("engine core ready %.1f s after its spawn", time.perf_counter() - self._spawned)
            if config is not None:
                mine = {"max_model_len": config.max_model_len, "block_size": config.block_size,
                        "eos_token_ids": sorted(eos_token_ids or ())}
                theirs = {name: self.ready.get(name) for name in mine}
                if theirs != mine:
                    raise RuntimeError(f"the engine core resolved the engine arguments differently from this "
                                       f"process: {theirs} against {mine}")
        except BaseException:
            self._closing = True
            self._stop_process(timeout=0.0)
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._receive_loop, name="nv-core-outputs", daemon=True)
        self._thread.start()

    def _wait_ready(self) -> dict[str, Any]:
        poller = zmq.Poller()
        poller.register(self._output, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        while True:
            events = dict(poller.poll(None))
            if self._output in events:
                kind, payload = self._receive_codec.decode(self._output.recv())
                if kind is CoreMessage.READY:
                    return payload    # type: ignore[return-value]  # dict[str, Any] by the protocol
                if kind is CoreMessage.ERROR:
                    raise RuntimeError(f"the engine core failed to start: {payload}")
                raise RuntimeError(f"the engine core sent {kind!r} before READY")
            if self.process.sentinel in events:
                self.process.join(1.0)
                raise RuntimeError(f"the engine core process exited during startup (exit code "
                                   f"{self.process.exitcode}); its log is above")

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and not self._closing and self._thread is not None

    # ---- frontend -> core --------------------------------------------------------------------
    def note_delivery(self, engine_index: int, seconds: float) -> None:
        """The frontend's time handing one OUTPUTS message's results to its consumers (engine_index is
        always 0 here: one core)."""
        self.timer.add("deliver", seconds)

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._send(CoreMessage.ADD, requests)

    def abort_requests(self, request_ids: list[str]) -> None:
        if self.is_alive:
            self._send(CoreMessage.ABORT, request_ids)

    def finish_requests(self, completions: list[tuple[str, int]]) -> None:
        if self.is_alive:
            self._send(CoreMessage.FINISH, completions)

    def call_utility(self, method: str, *args: int) -> concurrent.futures.Future[int]:
        """Call an EngineCore utility method (engine_core_process.UTILITY_METHODS) in the core."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = future
        try:
            self._send(CoreMessage.UTILITY, (call_id, method, args))
        except BaseException:
            self._calls.pop(call_id, None)
            raise
        return future

    def _send(self, kind: CoreMessage, payload: object) -> None:
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or "the engine core is shut down")
        with self._send_lock:
            self._input.send(self._send_codec.encode(kind, payload), copy=False)

    # ---- core -> frontend (the receiver thread) ----------------------------------------------
    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._output, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        try:
            while not self._closing:
                events = dict(poller.poll(_POLL_MS))
                if self._output in events:
                    self._take_messages()
                elif self.process.sentinel in events:
                    self.process.join(1.0)
                    if not self._closing:
                        self._died(f"the engine core process exited unexpectedly (exit code "
                                   f"{self.process.exitcode})")
                    return
        except Exception as exc:         # a bug here must not leave requests hanging
            logger.exception("the engine-core receiver failed")
            self._died(f"the engine-core receiver failed: {exc!r}")

    def _take_messages(self) -> None:
        timer, clock = self.timer, time.perf_counter
        while True:
            try:
                frame = self._output.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            started = clock()
            kind, payload = self._receive_codec.decode(frame.buffer)
            if kind is CoreMessage.OUTPUTS:
                decoded = clock()
                timer.add("decode", decoded - started)
                self._on_outputs(payload)     # type: ignore[arg-type]  # EngineCoreOutputs by the codec
                handled = clock()
                timer.add("handle", handled - decoded)
                timer.end_round(handled)
            elif kind is CoreMessage.UTILITY_RESULT:
                call_id, ok, value = payload  # type: ignore[misc]  # tuple[int, bool, int | str]
                future = self._calls.pop(call_id, None)
                if future is not None:
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(RuntimeError(value))
            elif kind is CoreMessage.ERROR:
                logger.error("the engine core failed: %s", payload)
                self.dead_reason = f"the engine core failed: {payload}"

    def _died(self, reason: str) -> None:
        if self.dead_reason is None:       # an ERROR message may have given the reason already
            self.dead_reason = reason
        logger.error("%s", self.dead_reason)
        calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(EngineDeadError(self.dead_reason))
        self._on_dead(self.dead_reason)

    # ---- lifetime ----------------------------------------------------------------------------
    def shutdown(self, timeout: float = 30.0) -> None:
        """Ask the core to stop (it shuts its executor down), then wait; kill it if it hangs. A core that is
        not ready yet (wait_ready() never returned) is terminated at once."""
        if self._closing:
            return
        ready = self._thread is not None
        if ready and self.dead_reason is None:
            try:
                with self._send_lock:
                    self._input.send(self._send_codec.encode(CoreMessage.SHUTDOWN, None))
            except zmq.ZMQError:
                pass
        self._closing = True
        self._stop_process(timeout if ready else 0.0)
        if self._thread is not None:
            self._thread.join(2 * _POLL_MS / 1000 + 1)
        self._close_sockets()

    @staticmethod
    def _shutdown_at_exit(client_ref: weakref.ref[EngineCoreClient]) -> None:
        client = client_ref()
        if client is not None:
            client.shutdown(timeout=10.0)

    def _stop_process(self, timeout: float) -> None:
        """Wait up to timeout for the core to exit; then SIGTERM (timeout 0: at once), then SIGKILL."""
        self._starter.join()
        process = self.process
        if process.pid is None:
            return
        process.join(timeout)
        if process.is_alive() and timeout > 0:
            logger.warning("the engine core did not stop in %.0f s: killing it", timeout)
        if process.is_alive():
            process.terminate()
            process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)

    def _close_sockets(self) -> None:
        if self._input.closed:
            return
        self._input.close(linger=0)
        self._output.close(linger=0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

