"""Executor: runs ModelRunner methods on every tensor-parallel rank.

Which executor `Executor.create` picks:
- WORLD_SIZE > 1 in the environment (launched by torchrun): TorchrunExecutor, every rank runs the
  whole engine in lockstep, env:// rendezvous, calls are local.
- tensor_parallel_size == 1: UniProcExecutor, the runner in this process.
- tensor_parallel_size > 1: MultiProcExecutor, ranks 1..N-1 in spawned worker processes, rank 0 here.

torch.distributed's default group is one per process, and the layers read the TP size from it at
run time. So a second engine in the same process (beside a live TP group, or a TP group beside a
live in-process runner) keeps *all* its ranks in worker processes instead; see `in_process_allowed`.
"""
from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from typing import Any

from nv_engine.executor.distributed import dist_in_use
from nv_engine.step import StepInput, StepResult

_owners_lock = threading.Lock()
_in_process_runners = 0  # live executors whose runner lives in this process


def register_in_process_runner(delta: int) -> None:
    global _in_process_runners
    with _owners_lock:
        _in_process_runners += delta


def in_process_allowed(tensor_parallel_size: int) -> bool:
    """Whether a runner (rank 0 of a group of this size) may live in this process."""
    if dist_in_use():
        return False
    return tensor_parallel_size == 1 or _in_process_runners == 0


def torchrun_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from None


class Executor(ABC):
    """Calls `runner.<method>(*args, **kwargs)` on every rank and returns rank 0's result."""

    rank: int = 0             # this process's rank (non-zero only under torchrun)
    world_size: int = 1

    @property
    def is_driver(self) -> bool:
        """True on the rank that prints / reports to the user (rank 0)."""
        return self.rank == 0

    @staticmethod
    def create(config: Any, runner_cls: Any = None, **kwargs: Any) -> "Executor":
        """The executor for `config` (see the module docstring). `runner_cls`: a class or a
        'module:Class' string importable in a spawned process (default nv_engine.runner.model_runner)."""
        from nv_engine.executor.multiproc import MultiProcExecutor
        from nv_engine.executor.torchrun import TorchrunExecutor
        from nv_engine.executor.uniproc import UniProcExecutor

        tp = config.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
        if torchrun_world_size() > 1:
            return TorchrunExecutor(config, runner_cls)
        if tp == 1 and in_process_allowed(1):
            return UniProcExecutor(config, runner_cls)
        return MultiProcExecutor(config, runner_cls, **kwargs)

    @abstractmethod
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """runner.<method>(*args, **kwargs) on every rank; rank 0's result. RuntimeError (never a
        hang) when a worker died or raised."""

    # ---- the runner's methods, on every rank ---------------------------------------------------
    def determine_num_blocks(self) -> int:
        """KV-cache blocks that fit on every rank (the smallest over the group)."""
        return int(self.call("determine_num_blocks"))

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.call("allocate_kv_cache", num_blocks)

    def capture_cudagraphs(self) -> None:
        self.call("capture_cudagraphs")

    def launch(self, step: StepInput) -> None:
        """Queue one step on every rank; its result comes from the matching `collect()`."""
        self.call("launch", step)

    def collect(self) -> StepResult | None:
        """Rank 0's result of the oldest launched, uncollected step."""
        return self.call("collect")

    def execute(self, step: StepInput) -> StepResult | None:
        """launch + collect."""
        return self.call("execute", step)

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the runners and any worker processes. Idempotent."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
