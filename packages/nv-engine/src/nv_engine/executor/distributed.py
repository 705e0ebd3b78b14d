"""torch.distributed set-up for one engine instance: backend choice, rendezvous store, timeouts, abort."""
from __future__ import annotations

import datetime
import importlib
import logging
import os

import torch
import torch.distributed as dist

# torch.distributed re-exports these store classes from torch._C without declaring them public
from torch.distributed import Store, TCPStore  # pyright: ignore[reportPrivateImportUsage]

from nv_engine import envs
from nv_engine.config.engine_config import DEFAULT_DISTRIBUTED_TIMEOUT_S
from nv_layers.parallel_state import mark_tp_group_aborted

logger = logging.getLogger(__name__)

DEFAULT_RUNNER = "nv_engine.runner.model_runner:ModelRunner"
# Upper bound for one collective (gloo honours it; NCCL's watchdog uses it): the engine argument
# distributed_timeout_s, this default where an executor is built without one.
DEFAULT_TIMEOUT_S = DEFAULT_DISTRIBUTED_TIMEOUT_S


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


def keep_nvls_off() -> None:
    """NVLink multicast (NVLS) stays off unless the user set it: it misbehaves on shared hosts.
    Both for NCCL and for torch's symmetric memory (the custom all-reduce maps peers' buffers
    point to point; without this its allocator would also set up multicast objects)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def set_cuda_device(device: str, local_rank: int) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.set_device(local_rank)


def share_cpu_threads(device: str, world_size: int) -> int | None:
    """On CPU, give each of the `world_size` ranks on this host its share of the cores.

    Idle OpenMP threads spin for a while after each parallel region; with every rank using all
    cores, the spinning starves the peer a collective waits for (measured: 100x slower steps on
    2 cores). An explicit OMP_NUM_THREADS (torchrun sets 1) is left alone. Returns the previous
    thread count when it changed it (None otherwise)."""
    if str(device).startswith("cuda") or world_size <= 1 or envs.omp_num_threads_set():
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, cores // world_size))
    return previous


def make_store_server(timeout_s: float) -> TCPStore:
    """A rendezvous store on a free port of 127.0.0.1, chosen by the OS (port 0): unique per engine."""
    return TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def init_group(*, backend: str, rank: int, world_size: int, timeout_s: float,
               store: Store | None = None, store_port: int | None = None) -> None:
    """init_process_group on `store` (or a client of the store at 127.0.0.1:store_port)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        if store_port is None:
            raise ValueError("init_group needs a store or a store_port")
        store = TCPStore("127.0.0.1", store_port, None, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def dist_in_use() -> bool:
    """True when this process already belongs to a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a group broken by a dead peer may refuse a clean teardown
            logger.debug("destroy_process_group failed", exc_info=True)


def abort_group() -> None:
    """Best-effort abort of the default group so a rank blocked in an NCCL collective returns (and
    a runner waiting on a symmetric-memory all-reduce stops waiting: see mark_tp_group_aborted)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    mark_tp_group_aborted()
    try:
        if dist.get_backend() != "nccl":
            return  # gloo raises on its own as soon as a peer's connection closes
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
        else:
            dist.distributed_c10d._get_default_group().abort()
    except Exception:
        logger.debug("aborting the process group failed", exc_info=True)


def resolve_runner_cls(spec: object) -> type:
    """A runner class from a class, or 'package.module:Class' / 'package.module.Class'."""
    if spec is None:
        spec = DEFAULT_RUNNER
    if isinstance(spec, type):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"runner_cls must be a class or a 'module:Class' string, got {spec!r}")
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"runner_cls {spec!r} is not of the form 'package.module:Class'")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"runner_cls {spec!r}: {module_name} has no class {attr!r}")
    return cls
