"""A fake runner for executor tests (importable in spawned workers and torchrun ranks).

Every method that should run on all ranks does an all_reduce, so a rank that skipped the call
would hang the others, and the returned sums prove every rank ran it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from nv_engine.core.sampling_batch import SamplingBatchBuilder
from nv_engine.core.step import StepInput
from nv_engine.executor.base import Executor
from nv_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class FakeConfig:
    tensor_parallel_size: int = 2
    device: str = "cpu"
    tag: int = 0                 # lets a test tell two executors apart
    fail_init_rank: int = -1     # this rank raises in __init__


def _sum(value: float) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64)
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
    return t.item()


class FakeRunner:
    def __init__(self, config: FakeConfig, rank: int) -> None:
        if rank == config.fail_init_rank:
            raise ValueError(f"fake init failure on rank {rank}")
        self.config, self.rank, self.num_calls = config, rank, 0

    def rank_sum(self) -> float:
        """sum over ranks of (rank + 1) + tag * world: 3 + 2*tag at TP=2."""
        self.num_calls += 1
        return _sum(self.rank + 1 + self.config.tag)

    def calls_sum(self) -> float:
        return _sum(self.num_calls)

    def nbytes_sum(self, blob: bytes) -> float:
        """every rank's len(blob), summed: world * len when every rank got the whole message."""
        return _sum(len(blob))

    def echo(self, value: object) -> object:
        _sum(0)
        return value

    def noop(self, step: object = None) -> None:
        return None

    def pid(self) -> int:
        return os.getpid()

    def raise_on(self, rank: int, before_collective: bool = True) -> float:
        if before_collective and self.rank == rank:
            raise ValueError(f"fake failure on rank {rank}")
        total = _sum(1)
        if self.rank == rank:
            raise ValueError(f"fake failure on rank {rank} after the collective")
        return total

    def exit_on(self, rank: int, code: int = 7) -> float:
        if self.rank == rank:
            os._exit(code)
        return _sum(1)   # the others block here until they notice the dead peer

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return _sum(1)

    def shutdown(self) -> None:
        pass


def measure_call_latency(executor: Executor, message: object, iters: int = 200) -> dict[str, float]:
    """Round-trip time of executor.run_on_all_ranks('noop', message) (send, run, acks), in microseconds."""
    for _ in range(10):
        executor.run_on_all_ranks("noop", message)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        executor.run_on_all_ranks("noop", message)
        times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return {"median_us": times[len(times) // 2], "p90_us": times[int(len(times) * 0.9)],
            "min_us": times[0]}


def engine_decode_step(num_seqs: int = 256, context_len: int = 1024, block_size: int = 16,
                       seed: int = 0) -> StepInput:
    """A real nv_engine StepInput of a pure decode step (with its SamplingBatch), as the engine
    sends it: `num_seqs` sequences of `context_len` tokens each."""
    rng = np.random.default_rng(seed)
    blocks = -(-context_len // block_size)
    block_tables = rng.integers(0, 1 << 16, (num_seqs, blocks), dtype=np.int32)      # [B, M]
    positions = np.full(num_seqs, context_len - 1, dtype=np.int64)
    slots = block_tables[:, -1].astype(np.int64) * block_size + positions % block_size
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
    sampling = SamplingBatchBuilder(vocab_size=151_936).build(
        [(params, seed + i, 100) for i in range(num_seqs)])
    return StepInput(
        input_ids=rng.integers(0, 151_000, num_seqs, dtype=np.int64), positions=positions,
        slot_mapping=slots, seq_lens=np.full(num_seqs, context_len, dtype=np.int32),
        cu_seqlens_q=np.arange(num_seqs + 1, dtype=np.int32), block_tables=block_tables,
        logits_indices=np.arange(num_seqs, dtype=np.int64), is_decode=True, max_seqlen_q=1,
        max_seqlen_k=context_len, sampling=sampling)


def run_torchrun(script: str, *args: str, nproc: int = 2,
                 timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N script args...` in a clean
    environment (no inherited rank variables, one CPU thread per rank); a CompletedProcess."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc), str(script), *args],
        capture_output=True, text=True, timeout=timeout, env=env)
