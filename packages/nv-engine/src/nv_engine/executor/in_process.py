"""InProcessExecutor: the base of the executors whose runner lives in this process (UniProcExecutor,
TorchrunExecutor). It holds the runner and closes it once, at shutdown() or when the executor is
garbage-collected."""
from __future__ import annotations

import logging
import weakref
from abc import ABC

from nv_engine.executor.base import Executor, register_in_process_runner
from nv_engine.executor.distributed import destroy_group

logger = logging.getLogger(__name__)


class InProcessExecutor(Executor, ABC):
    shares_host_memory = True

    def _hold(self, runner: object, owns_group: bool = False) -> None:
        """Own `runner`; owns_group: closing also destroys this process's torch.distributed group."""
        register_in_process_runner(+1)
        self._holder = [runner]   # the finalizer owns the runner through this list, not through self
        self._finalizer = weakref.finalize(self, self._close, self._holder, owns_group)

    @staticmethod
    def _close(holder: list[object], owns_group: bool) -> None:
        """Shut the held runner down (once; a static method: the finalizer must not hold self)."""
        runner = holder.pop() if holder else None
        if runner is not None:
            register_in_process_runner(-1)
            shutdown = getattr(runner, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:
                    logger.warning("runner.shutdown() failed", exc_info=True)
        if owns_group:
            destroy_group()

    @property
    def runner(self) -> object:
        if not self._holder:
            raise RuntimeError("executor is shut down")
        return self._holder[0]

    def shutdown(self) -> None:
        self._finalizer()
