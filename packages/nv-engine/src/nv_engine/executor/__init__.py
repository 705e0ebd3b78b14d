"""Executors: run ModelRunner methods on every tensor-parallel rank.

Which executor `create_executor` picks:
- WORLD_SIZE > 1 in the environment (launched by torchrun): TorchrunExecutor, every rank runs the
  whole engine in lockstep, env:// rendezvous, calls are local.
- tensor_parallel_size == 1: UniProcExecutor, the runner in this process.
- tensor_parallel_size > 1: MultiProcExecutor, ranks 1..N-1 in spawned worker processes, rank 0 here
  (all ranks in workers when this process cannot host one, see base.in_process_allowed).
"""
from __future__ import annotations

from nv_engine.executor.base import Executor, RankConfig, RunnerSpec, in_process_allowed, torchrun_world_size
from nv_engine.executor.distributed import DEFAULT_TIMEOUT_S
from nv_engine.executor.multiproc import DEFAULT_FAILURE_GRACE_S, MultiProcExecutor
from nv_engine.executor.torchrun import TorchrunExecutor
from nv_engine.executor.uniproc import UniProcExecutor


def create_executor(config: RankConfig, runner_cls: RunnerSpec = None, *,
                    driver_in_process: bool | None = None, timeout_s: float | None = None,
                    failure_grace_s: float | None = None) -> Executor:
    """The executor for `config` (see the module docstring). `runner_cls`: a class or a
    'module:Class' string importable in a spawned process (default nv_engine.runner.model_runner).
    The keyword arguments tune MultiProcExecutor (None: the defaults)."""
    tp = config.tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    if torchrun_world_size() > 1:
        return TorchrunExecutor(config, runner_cls, timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
    if tp == 1 and in_process_allowed(1):
        return UniProcExecutor(config, runner_cls)
    return MultiProcExecutor(config, runner_cls, driver_in_process=driver_in_process,
                             timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s,
                             failure_grace_s=DEFAULT_FAILURE_GRACE_S if failure_grace_s is None else failure_grace_s)


__all__ = ["Executor", "MultiProcExecutor", "TorchrunExecutor", "UniProcExecutor", "create_executor"]
