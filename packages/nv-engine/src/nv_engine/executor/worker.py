"""The worker process of MultiProcExecutor, and the message format of the control channel.

Channel: one duplex multiprocessing Pipe (a socket pair) per worker, created for this engine
instance only. Each message is one pickle sent with `send_bytes`, which writes a length prefix,
so there is no size cap (nano-vllm's weak spot was a fixed-name 1 MB shared-memory buffer).
  driver -> worker: (call_id, method, args, kwargs)
  worker -> driver: (kind, call_id, payload), kind in HELLO, READY, OK, ERR, BYE;
                    OK carries the result only when the driver asked for it (rank 0 in a worker),
                    ERR carries the formatted traceback.
Measured on CPU (2 cores, TP=2, gloo): a call carrying the engine's decode StepInput of 256
sequences (86 KB at 1k-token contexts) round-trips (send, run a no-op, ack) in about 0.1 ms;
an empty call in 0.04 ms (`testing.measure_call_latency`).
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection

from nv_engine.executor.base import RankConfig, RunnerSpec
from nv_engine.executor.distributed import (
    destroy_group,
    init_group,
    keep_nvls_off,
    resolve_runner_cls,
    set_cuda_device,
    share_cpu_threads,
)

HELLO, READY, OK, ERR, BYE = "hello", "ready", "ok", "err", "bye"
SHUTDOWN = "__nv_shutdown__"
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode(message: object) -> bytes:
    return pickle.dumps(message, protocol=PICKLE_PROTOCOL)


def _reply(conn: Connection, kind: str, call_id: int, payload: object = None) -> None:
    try:
        data = encode((kind, call_id, payload))
    except Exception:  # an unpicklable result becomes this rank's error
        data = encode((ERR, call_id, "result could not be pickled:\n" + traceback.format_exc()))
    conn.send_bytes(data)


def worker_main(*, rank: int, world_size: int, config: RankConfig, runner_spec: RunnerSpec,
                conn: Connection, store_port: int | None, backend: str, timeout_s: float,
                return_result: bool) -> None:
    """Entry point of a spawned worker: init torch.distributed, build the runner, serve calls."""
    # Ctrl-C reaches the whole process group; the driver decides what happens, workers keep going.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_nvls_off()
    runner = None
    try:
        _reply(conn, HELLO, -1, os.getpid())
        set_cuda_device(config.device, rank)
        share_cpu_threads(config.device, world_size)
        if world_size > 1:
            init_group(backend=backend, rank=rank, world_size=world_size, timeout_s=timeout_s,
                       store_port=store_port)
        runner = resolve_runner_cls(runner_spec)(config, rank)
        _reply(conn, READY, 0)
        _serve(conn, runner, return_result)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the driver is gone: nothing to report to
    except BaseException:
        try:
            _reply(conn, ERR, 0, traceback.format_exc())
        except OSError:
            pass
    finally:
        shutdown = getattr(runner, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:
                traceback.print_exc()
        destroy_group()
        try:
            _reply(conn, BYE, -1)
        except OSError:
            pass
        conn.close()
        # The runner and the group are torn down; skip the interpreter's own teardown of torch
        # (about half a second per worker) so that shutdown is quick.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _serve(conn: Connection, runner: object, return_result: bool) -> None:
    while True:
        call_id, method, args, kwargs = pickle.loads(conn.recv_bytes())
        if method == SHUTDOWN:
            return
        try:
            result = getattr(runner, method)(*args, **kwargs)
        except BaseException:
            _reply(conn, ERR, call_id, traceback.format_exc())
            continue
        _reply(conn, OK, call_id, result if return_result else None)
