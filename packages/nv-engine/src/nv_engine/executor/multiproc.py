"""MultiProcExecutor: tensor_parallel_size > 1 on one machine with spawned worker processes.

Rank 0's runner lives in the engine process (the driver); ranks 1..N-1 are spawned processes.
When this process cannot host a rank (another TP group or in-process runner is live here, see
base.py), every rank is spawned and rank 0's result comes back over its pipe.

Rendezvous: a TCPStore on a port the OS picks (port 0), one per engine instance. Control channel:
one pipe per worker (worker.py). Every call is acknowledged by every worker.

Failure rule: a worker that raises makes `call` raise RuntimeError with its traceback. When every
rank finished the call (e.g. all raised, or the method has no collective) the executor stays
usable; when some rank is still busy `failure_grace_s` after the failure (stuck in a collective)
the workers are terminated and the executor is closed. A dead worker always closes the executor;
the call raises within about a second (gloo raises as its peer's socket closes; NCCL is aborted).
"""
from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable

import torch

from nv_engine.executor.base import Executor, RankConfig, RunnerSpec, in_process_allowed, register_in_process_runner
from nv_engine.executor.distributed import (
    DEFAULT_TIMEOUT_S,
    TCPStore,
    abort_group,
    backend_for,
    destroy_group,
    init_group,
    keep_nvls_off,
    make_store_server,
    resolve_runner_cls,
    set_cuda_device,
    share_cpu_threads,
)
from nv_engine.executor.group import WorkerGroup
from nv_engine.executor.worker import ERR, encode

logger = logging.getLogger(__name__)

DEFAULT_FAILURE_GRACE_S = 2.0   # how long the other ranks may take to finish a call after one failed


class _State:
    """Everything the finalizer needs, without a reference back to the executor."""

    def __init__(self) -> None:
        self.group: WorkerGroup | None = None
        self.store: TCPStore | None = None
        self.runner: object | None = None   # rank 0's runner when it lives in this process
        self.counted = False        # registered as an in-process runner
        self.owns_group = False     # this process joined a torch.distributed group for it
        self.closed: str | None = None
        self.threads_before: int | None = None   # torch threads of this process before rank 0
        self.call_id = 0
        self.lock = threading.Lock()

    def close(self, reason: str = "the executor was shut down") -> None:
        if self.closed is None:
            self.closed = reason
        group, runner, self.runner = self.group, self.runner, None
        if group is not None:
            group.request_shutdown()
        if runner is not None:
            shutdown = getattr(runner, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:
                    logger.warning("rank 0 runner.shutdown() failed", exc_info=True)
        if self.owns_group:
            destroy_group()
            self.owns_group = False
        if self.counted:
            register_in_process_runner(-1)
            self.counted = False
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)
            self.threads_before = None
        if group is not None:
            group.join_and_stop()
            self.group = None
        self.store = None


class MultiProcExecutor(Executor):
    def __init__(self, config: RankConfig, runner_cls: RunnerSpec = None, *, driver_in_process: bool | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 failure_grace_s: float = DEFAULT_FAILURE_GRACE_S) -> None:
        world_size = config.tensor_parallel_size
        cls = resolve_runner_cls(runner_cls)   # fail here, not in the workers, on a bad name
        allowed = in_process_allowed(world_size)
        if driver_in_process is None:
            driver_in_process = allowed
        elif driver_in_process and not allowed:
            raise ValueError("driver_in_process=True but this process already hosts a tensor-"
                             "parallel group or runner")
        self.world_size = world_size
        self.driver_in_process = driver_in_process
        backend = backend_for(config.device)
        keep_nvls_off()
        state = self._state = _State()
        self._finalizer = weakref.finalize(self, state.close)
        try:
            state.store = make_store_server(timeout_s) if world_size > 1 else None
            first_worker = 1 if driver_in_process else 0
            state.group = WorkerGroup(
                ranks=range(first_worker, world_size), grace_s=failure_grace_s,
                on_broken=abort_group if driver_in_process else (lambda: None),
                world_size=world_size, config=config, runner_spec=runner_cls or cls,
                store_port=state.store.port if state.store is not None else None,
                backend=backend, timeout_s=timeout_s, return_result=not driver_in_process)
            state.group.wait_hellos()
            self._start_local_rank(config, cls, backend, timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _start_local_rank(self, config: RankConfig, cls: type, backend: str, timeout_s: float) -> None:
        state = self._state

        def build() -> None:
            set_cuda_device(config.device, 0)
            state.threads_before = share_cpu_threads(config.device, self.world_size)
            register_in_process_runner(+1)
            state.counted = True
            if self.world_size > 1:
                init_group(backend=backend, rank=0, world_size=self.world_size,
                           timeout_s=timeout_s, store=state.store)
                state.owns_group = True
            state.runner = cls(config, 0)

        self._run_everywhere("__init__", 0, build if self.driver_in_process else None)

    @property
    def worker_pids(self) -> dict[int, int]:
        """rank -> pid of each spawned worker."""
        group = self._state.group
        return group.pids if group is not None else {}

    def run_on_all_ranks(self, method: str, *args: object, **kwargs: object) -> object:
        state = self._state
        with state.lock:
            if state.group is not None and state.group.broken is not None:
                state.close(state.group.broken)
            if state.closed is not None or state.group is None:
                raise RuntimeError(f"tensor-parallel executor is closed: {state.closed}")
            if state.runner is not None and not callable(getattr(state.runner, method, None)):
                raise AttributeError(f"{type(state.runner).__name__} has no method {method!r}")
            state.call_id += 1
            call_id = state.call_id
            try:
                state.group.broadcast(encode((call_id, method, args, kwargs)))
            except RuntimeError:
                state.close(state.group.broken or "a worker cannot be reached")
                raise
            runner = state.runner

            def local() -> object:
                return getattr(runner, method)(*args, **kwargs)

            return self._run_everywhere(method, call_id, local if runner is not None else None)

    def _run_everywhere(self, method: str, call_id: int, local: Callable[[], object] | None) -> object:
        """Run `local` (rank 0 here, if any), gather the workers' acks, apply the failure rule."""
        state = self._state
        group = state.group
        if group is None:
            raise RuntimeError(f"tensor-parallel executor is closed: {state.closed}")
        result, local_exc = None, None
        if local is not None:
            group.set_local_busy(True)
            try:
                result = local()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the workers
                local_exc = exc
            finally:
                group.set_local_busy(False)
        replies = group.collect(call_id, local_failed=local_exc is not None)
        if group.broken is not None:
            state.close(group.broken)
        errors = {rank: payload for rank, (kind, payload) in sorted(replies.items()) if kind == ERR}
        closed_note = f"\nThe executor is closed: {group.broken}" if group.broken else ""
        if errors:
            rank, trace = next(iter(errors.items()))
            others = f" (ranks {sorted(errors)} raised)" if len(errors) > 1 else ""
            raise RuntimeError(f"tensor-parallel worker rank {rank} raised in {method}(){others}:\n"
                               f"{trace}{closed_note}") from local_exc
        if group.broken is not None and (local_exc is None or group.broken_by_death):
            raise RuntimeError(f"tensor-parallel executor failed in {method}(): "
                               f"{group.broken}") from local_exc
        if local_exc is not None:
            if closed_note:
                local_exc.add_note(closed_note.strip())
            raise local_exc
        return result if self.driver_in_process else replies[0][1]

    def shutdown(self) -> None:
        self._finalizer()
