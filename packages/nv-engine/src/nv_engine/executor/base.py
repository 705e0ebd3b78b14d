"""Executor: runs ModelRunner methods on every tensor-parallel rank (`create_executor` in this
package's __init__ picks the kind).

torch.distributed's default group is one per process, and the layers read the TP size from it at
run time. So a second engine in the same process (beside a live TP group, or a TP group beside a
live in-process runner) keeps *all* its ranks in worker processes instead; see `in_process_allowed`.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Protocol, Self, cast

import numpy as np

from nv_engine import envs
from nv_engine.core.step import StepInput, StepResult
from nv_engine.executor.distributed import dist_in_use

_owners_lock = threading.Lock()
_in_process_runners = 0  # live executors whose runner lives in this process


class RankConfig(Protocol):
    """What the executors read of a config (nv_engine.config.engine_config.EngineConfig; the whole config is
    handed, pickled, to the runner class on every rank)."""

    @property
    def tensor_parallel_size(self) -> int: ...

    @property
    def device(self) -> str: ...


# A runner class, or 'package.module:Class' importable in a spawned process; None: ModelRunner.
RunnerSpec = type | str | None


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
    world_size = envs.world_size()
    return 1 if world_size is None else world_size


class Executor(ABC):
    """The runner's methods on every rank, rank 0's result. The typed methods below are what the
    engine calls; they all go through `run_on_all_ranks`, the by-name transport."""

    rank: int = 0             # this process's rank (non-zero only under torchrun)
    world_size: int = 1
    # this process's runner reads the arrays given to the methods below as they are (no copy between
    # processes): they may live in page-locked memory for its device copies
    shares_host_memory: bool = False

    @property
    def is_driver(self) -> bool:
        """True on the rank that prints / reports to the user (rank 0)."""
        return self.rank == 0

    @abstractmethod
    def run_on_all_ranks(self, method: str, *args: object, **kwargs: object) -> object:
        """runner.<method>(*args, **kwargs) on every rank; rank 0's result. RuntimeError (never a
        hang) when a worker died or raised. The transport of the typed methods below (and of tests
        with runners of their own); engine code calls the typed methods."""

    # ---- the runner's methods, on every rank ---------------------------------------------------
    def determine_num_blocks(self) -> int:
        """KV-cache blocks that fit on every rank (the smallest over the group)."""
        return int(cast(int, self.run_on_all_ranks("determine_num_blocks")))

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.run_on_all_ranks("allocate_kv_cache", num_blocks)

    def capture_cudagraphs(self) -> None:
        self.run_on_all_ranks("capture_cudagraphs")

    def launch(self, step: StepInput) -> None:
        """Queue one step on every rank; its result comes from the matching `collect()`."""
        self.run_on_all_ranks("launch", step)

    def sample(self, token_bitmask: np.ndarray | None) -> None:
        """Sample, on every rank, the step launched with defer_sampling (its result from `collect()`)."""
        self.run_on_all_ranks("sample", token_bitmask)

    def collect(self) -> StepResult | None:
        """Rank 0's result of the oldest launched, uncollected step."""
        return cast("StepResult | None", self.run_on_all_ranks("collect"))

    def execute(self, step: StepInput) -> StepResult | None:
        """launch + collect."""
        return cast("StepResult | None", self.run_on_all_ranks("execute", step))

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the runners and any worker processes. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
