"""UniProcExecutor: tensor_parallel_size == 1, the runner in the engine process."""
from __future__ import annotations

from nv_engine.executor.base import RankConfig, RunnerSpec
from nv_engine.executor.distributed import resolve_runner_cls
from nv_engine.executor.in_process import InProcessExecutor


class UniProcExecutor(InProcessExecutor):
    def __init__(self, config: RankConfig, runner_cls: RunnerSpec = None) -> None:
        self._hold(resolve_runner_cls(runner_cls)(config, 0))

    def run_on_all_ranks(self, method: str, *args: object, **kwargs: object) -> object:
        return getattr(self.runner, method)(*args, **kwargs)
