"""TorchrunExecutor: every rank (a process started by torchrun) runs the whole engine in lockstep.

The engine on each rank makes the same scheduler decisions from the same inputs and seeds, so
no control channel is needed: `call` runs the local runner and the collectives inside it pair up
across ranks. torch.distributed uses the env:// rendezvous torchrun provides (MASTER_ADDR/PORT,
RANK, WORLD_SIZE), so the group can span machines. Each call ends with one all_gather_object
that hands rank 0's result to every rank (the engines stay in lockstep) and a failure on any rank
to all of them. Only rank 0 (`is_driver`) should print.

That exchange goes over a gloo group on the CPU: over NCCL it would wait for the device to finish
the step (the object travels as a device tensor), so `launch` of step N+1 could not return before
step N ran out, and async scheduling would overlap nothing.
"""
from __future__ import annotations

import datetime
import traceback

import torch.distributed as dist

from nv_engine import envs
from nv_engine.executor.base import RankConfig, RunnerSpec
from nv_engine.executor.distributed import (
    DEFAULT_TIMEOUT_S,
    backend_for,
    keep_nvls_off,
    resolve_runner_cls,
    set_cuda_device,
)
from nv_engine.executor.in_process import InProcessExecutor


class TorchrunExecutor(InProcessExecutor):
    def __init__(self, config: RankConfig, runner_cls: RunnerSpec = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            world_size, rank = envs.world_size(), envs.rank()
        except ValueError as exc:
            raise ValueError(f"TorchrunExecutor: {exc} (start the script with torchrun)") from exc
        if rank is None or world_size is None:
            raise ValueError("TorchrunExecutor needs WORLD_SIZE and RANK in the environment "
                             "(start the script with torchrun)")
        local_rank = envs.local_rank(rank)
        if config.tensor_parallel_size != world_size:
            raise ValueError(f"under torchrun tensor_parallel_size must equal WORLD_SIZE: got "
                             f"tensor_parallel_size={config.tensor_parallel_size}, WORLD_SIZE={world_size}")
        cls = resolve_runner_cls(runner_cls)
        self.rank, self.world_size = rank, world_size
        keep_nvls_off()
        set_cuda_device(config.device, local_rank)
        owns_group = not dist.is_initialized()
        if owns_group:
            dist.init_process_group(backend_for(config.device), init_method="env://", rank=rank,
                                    world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        elif dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise ValueError("torch.distributed is initialised with a different rank / world size "
                             "than RANK / WORLD_SIZE")
        # the control exchange: gloo (CPU) whatever the model's backend; collective, like the runner
        self.control_group: dist.ProcessGroup | None = None
        if dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            self.control_group = group if isinstance(group, dist.ProcessGroup) else None   # every rank is a member
        self._hold(cls(config, rank), owns_group)

    def run_on_all_ranks(self, method: str, *args: object, **kwargs: object) -> object:
        """Run locally, then share outcomes: every rank returns rank 0's result (the runner
        returns sampled ids on rank 0 only), and every rank raises when any rank failed."""
        runner = self.runner
        result, error, trace = None, None, None
        try:
            result = getattr(runner, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            error, trace = exc, traceback.format_exc()
        outcomes: list[tuple[str | None, object] | None] = [None] * self.world_size
        dist.all_gather_object(outcomes, (trace, result if self.rank == 0 else None), group=self.control_group)
        if error is not None:
            raise error
        shared = [outcome for outcome in outcomes if outcome is not None]   # [world_size] (trace, result)
        failed = [(rank, tb) for rank, (tb, _) in enumerate(shared) if tb is not None]
        if failed:
            rank, tb = failed[0]
            raise RuntimeError(f"rank {rank} raised in {method}():\n{tb}")
        return shared[0][1]
