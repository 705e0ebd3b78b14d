"""UniProcExecutor: tensor_parallel_size == 1, the runner in the engine process."""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from nv_engine.executor.base import Executor, register_in_process_runner
from nv_engine.executor.distributed import resolve_runner_cls

logger = logging.getLogger(__name__)


def _close_runner(holder: list) -> None:
    runner = holder.pop() if holder else None
    if runner is None:
        return
    register_in_process_runner(-1)
    shutdown = getattr(runner, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown()
        except Exception:
            logger.warning("runner.shutdown() failed", exc_info=True)


class InProcessExecutor(Executor):
    """Base of the executors whose runner lives in this process: holds it and closes it once, at
    shutdown() or when the executor is garbage-collected."""

    def _hold(self, runner: Any, close: Callable[..., None] = _close_runner, *close_args: Any) -> None:
        register_in_process_runner(+1)
        self._holder = [runner]   # the finalizer owns the runner through this list, not through self
        self._finalizer = weakref.finalize(self, close, self._holder, *close_args)

    @property
    def runner(self) -> Any:
        if not self._holder:
            raise RuntimeError("executor is shut down")
        return self._holder[0]

    def shutdown(self) -> None:
        self._finalizer()


class UniProcExecutor(InProcessExecutor):
    def __init__(self, config: Any, runner_cls: Any = None) -> None:
        self._hold(resolve_runner_cls(runner_cls)(config, 0))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.runner, method)(*args, **kwargs)
