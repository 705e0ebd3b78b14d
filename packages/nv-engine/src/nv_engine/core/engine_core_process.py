"""EngineCoreProcess: an EngineCore in its own process, looping over ZMQ (vLLM's EngineCoreProc is
the model).

The frontend binds two ipc:// sockets and spawns this process, which connects: inputs come in on a
PULL socket, outputs go out on a PUSH socket (messages: engine_core_message.py). Before each step
the loop takes every queued input (adds, aborts, finishes, utility calls), so a burst of requests
joins one step; while no request is unfinished it blocks in zmq poll with no timeout (an idle core
costs no CPU). It also wakes when the frontend process dies, and then exits.

SIGINT is ignored (Ctrl-C reaches the whole process group; the frontend shuts the core down with a
SHUTDOWN message); SIGTERM ends it.

Where the loop's time goes is summed per step by a StageTimer and logged at DEBUG every 10 s
(NV_LOGGING_LEVEL=DEBUG): `step` (inside EngineCore.step, with `device wait`: the part spent in the
executor's collect / execute, waiting for the device's result), `outputs` (encoding and sending the
step's outputs), `inputs` (receiving and handling the queued inputs) and `idle` (blocked with no
unfinished request).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import zmq

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.config.logging_config import configure_logging
from nv_engine.core.engine_core import EngineCore
from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.stage_timer import StageTimer
from nv_engine.core.startup_heap import freeze_startup_heap
from nv_engine.engine.engine_requests import eos_token_ids as eos_token_ids_of
from nv_engine.engine.engine_requests import load_tokenizer

logger = logging.getLogger(__name__)

_Result = TypeVar("_Result")

# EngineCore methods a frontend may call (all take and return ints)
UTILITY_METHODS = frozenset({"get_num_free_blocks", "get_num_unfinished_requests"})


class EngineCoreProcess:
    """The loop of one engine-core process (`EngineCoreProcess.main` is the spawn target)."""

    def __init__(self, core: EngineCore, inputs: zmq.Socket, outputs: zmq.Socket,
                 parent_sentinel: int | None) -> None:
        self.core = core
        self.inputs = inputs
        self.outputs = outputs
        self.poller = zmq.Poller()
        self.poller.register(inputs, zmq.POLLIN)
        if parent_sentinel is not None:
            self.poller.register(parent_sentinel, zmq.POLLIN)
        self.parent_sentinel = parent_sentinel
        self.running = True
        self._failed: list[tuple[str, str]] = []    # (request id, message), sent with the next outputs
        self.codec = CoreMessageCodec()
        self.timer = StageTimer("engine core loop", "step", ("step", "device wait", "outputs", "inputs", "idle"),
                                logger, notes={"step": "device wait"})
        executor = core.executor
        if executor is not None:     # the executor's collect / execute is where a step waits for the device
            executor.collect = self._timed_device_wait(executor.collect)    # type: ignore[method-assign]
            executor.execute = self._timed_device_wait(executor.execute)    # type: ignore[method-assign]

    @staticmethod
    def main(engine: EngineConfig | EngineArgs, eos_token_ids: list[int] | None, input_address: str,
             output_address: str, log_level: int, env: dict[str, str] | None = None) -> None:
        """Spawn target: start the core, send READY (or ERROR with the reason), then loop. engine: the
        frontend's EngineConfig with its eos_token_ids, or EngineArgs with None: the config and EOS ids are
        then resolved here as the frontend resolves them (READY names them, for the frontend to check). env:
        variables the frontend set for this core (a process forked from a forkserver has the server's
        environment)."""
        os.environ.update(env or {})
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        configure_logging(log_level)
        codec = CoreMessageCodec()
        context = zmq.Context()
        inputs = context.socket(zmq.PULL)
        inputs.connect(input_address)
        outputs = context.socket(zmq.PUSH)
        outputs.setsockopt(zmq.LINGER, 5000)     # the last outputs reach the frontend before exit
        outputs.connect(output_address)
        try:
            logger.info("engine core starting (pid %d)", os.getpid())
            building = time.perf_counter()
            try:
                if isinstance(engine, EngineArgs):
                    config = engine.create_engine_config()
                    eos_token_ids = sorted(eos_token_ids_of(config, load_tokenizer(config)))
                else:
                    config = engine
                core = EngineCore(config, eos_token_ids or (), record_timestamps=True)
            except BaseException as exc:
                logger.exception("engine core failed to start")
                outputs.send(codec.encode(CoreMessage.ERROR, f"{type(exc).__name__}: {exc}"))
                return
            parent = multiprocessing.parent_process()
            proc = EngineCoreProcess(core, inputs, outputs, parent.sentinel if parent is not None else None)
            freeze_startup_heap("engine core")   # no full collection walks the model and imports between steps
            outputs.send(codec.encode(CoreMessage.READY, {
                "num_blocks": core.num_blocks, "max_model_len": config.max_model_len,
                "block_size": config.block_size, "eos_token_ids": sorted(core.eos_token_ids), "pid": os.getpid()}))
            logger.info("engine core ready: %d KV blocks of %d tokens; EngineCore built in %.1f s (model load, KV "
                        "cache, CUDA graphs, warm-up)", core.num_blocks, config.block_size,
                        time.perf_counter() - building)
            try:
                proc.run()
            except BaseException as exc:
                logger.exception("engine core failed")
                outputs.send(codec.encode(CoreMessage.ERROR, f"{type(exc).__name__}: {exc}"))
            finally:
                core.shutdown()
        finally:
            inputs.close(linger=0)
            outputs.close()
            context.term()

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        core = self.core
        timer = self.timer
        clock = time.perf_counter
        while self.running:
            idle = not core.has_unfinished_requests()
            # idle: block until an input (or the frontend's death); busy: only take what is queued
            started = clock()
            events = dict(self.poller.poll(None if idle else 0))
            polled = clock()
            timer.add("idle", polled - started)
            if self.parent_sentinel is not None and self.parent_sentinel in events:
                logger.warning("the frontend process is gone: the engine core exits")
                return
            if self.inputs in events:
                self._take_inputs()
            if not self.running:
                return
            if core.has_unfinished_requests():
                stepped = clock()
                timer.add("inputs", stepped - polled)
                outputs = self._step()
                sending = clock()
                timer.add("step", sending - stepped)
                self._send(CoreMessage.OUTPUTS, outputs)
                sent = clock()
                timer.add("outputs", sent - sending)
                timer.end_round(sent)
            elif self._failed:
                self._send(CoreMessage.OUTPUTS, EngineCoreOutputs([], time.monotonic(), failed=self._take_failed()))

    def _step(self) -> EngineCoreOutputs:
        core = self.core
        before = list(core.requests)       # a failed step aborts some of these
        try:
            outputs = core.step_outputs()
        except Exception as exc:     # the core aborted the step's requests and stays usable
            logger.exception("an engine step failed")
            message = f"the engine step failed: {type(exc).__name__}: {exc}"
            self._failed.extend((request_id, message) for request_id in before if request_id not in core.requests)
            outputs = EngineCoreOutputs([], time.monotonic())
        if self._failed:
            outputs.failed = self._take_failed()
        return outputs

    def _take_failed(self) -> list[tuple[str, str]]:
        failed, self._failed = self._failed, []
        return failed

    def _take_inputs(self) -> None:
        """Every queued input, oldest first."""
        while True:
            try:
                frame = self.inputs.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            kind, payload = self.codec.decode(frame.buffer)
            self._handle(kind, payload)
            if not self.running:
                return

    def _handle(self, kind: CoreMessage, payload: object) -> None:
        core = self.core
        if kind is CoreMessage.ADD:
            self._add(payload)       # type: ignore[arg-type]  # list[EngineCoreRequest] by the protocol
        elif kind is CoreMessage.ABORT:
            core.abort_requests(payload)       # type: ignore[arg-type]  # list[str]
        elif kind is CoreMessage.FINISH:
            core.finish_requests(payload)      # type: ignore[arg-type]  # list[tuple[str, int]]
        elif kind is CoreMessage.UTILITY:
            call_id, method, args = payload    # type: ignore[misc]
            if method not in UTILITY_METHODS:
                self._send(CoreMessage.UTILITY_RESULT, (call_id, False, f"no utility method {method!r}"))
                return
            try:
                result = getattr(core, method)(*args)
            except Exception as exc:
                self._send(CoreMessage.UTILITY_RESULT, (call_id, False, f"{type(exc).__name__}: {exc}"))
                return
            self._send(CoreMessage.UTILITY_RESULT, (call_id, True, result))
        elif kind is CoreMessage.SHUTDOWN:
            self.running = False
        else:
            logger.error("unknown engine-core message %r", kind)

    def _add(self, requests: Iterable[EngineCoreRequest]) -> None:
        for request in requests:
            try:
                self.core.add_request(request)
            except (ValueError, TypeError) as exc:   # the frontend checked; the scheduler may still refuse
                self._failed.append((request.request_id, str(exc)))

    def _send(self, kind: CoreMessage, payload: object) -> None:
        self.outputs.send(self.codec.encode(kind, payload), copy=False)

    def _timed_device_wait(self, call: Callable[..., _Result]) -> Callable[..., _Result]:
        timer, clock = self.timer, time.perf_counter

        def timed(*args: object) -> _Result:
            started = clock()
            try:
                return call(*args)
            finally:
                timer.add("device wait", clock() - started)
        return timed
