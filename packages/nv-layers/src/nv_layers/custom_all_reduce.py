"""SymmMemAllReduce: an all-reduce for small tensors over peer-to-peer symmetric memory.

NCCL's all-reduce costs tens of microseconds even for a [1, hidden] tensor; a decode step does two
per layer. This one uses torch's symmetric memory (torch.distributed._symmetric_memory, a private
API imported lazily): one buffer per rank, allocated once and mapped into every peer's address
space over NVLink / PCIe peer access (`rendezvous`). An all-reduce copies the input into this
rank's buffer, then torch's one-shot kernel (`symm_mem::one_shot_all_reduce_out`) meets every peer
at a barrier in the signal pads, reads all the ranks' buffers and writes the sum into the input.

Deterministic: the kernel loads the peers' vectors in a staggered order but adds them in rank order
0..N-1 (`load_and_reduce` in torch's CUDASymmetricMemory-inl.h), so every rank gets bitwise the same
sum, which the sampler on every rank relies on (identical logits, identical ids).
CUDA graphs: the buffer and the signal pads are fixed at init and the barriers reset themselves,
so the copy and the kernel are captured and replayed like any other kernels.
Peer-to-peer only: NVLink multicast (NVLS, the `multimem_*` ops) is never used, and its set-up is
turned off before the first allocation (TORCH_SYMM_MEM_DISABLE_MULTICAST).
Tensors of another dtype or device, non-contiguous, misaligned or larger than the buffer go to
NCCL; so does everything when symmetric memory is missing (`create` returns None).
"""
from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import cast

import torch
import torch.distributed as dist

from nv_layers import envs

logger = logging.getLogger(__name__)

# Buffer size: a decode step's [batch, hidden] activations (256 x 4096 bf16 = 2 MiB) and short
# prefill chunks fit; a long prefill's all-reduce is bandwidth-bound and goes to NCCL.
DEFAULT_MAX_BYTES = 8 << 20
# With more than two ranks one-shot reads (N - 1) x size over the links: beyond this NCCL's ring wins.
MULTI_RANK_MAX_BYTES = 512 << 10
_ALIGNMENT = 16   # bytes: the kernel's widest vector load
_DTYPES = (torch.bfloat16, torch.float32)   # what torch's one-shot kernel dispatches on


def _one_shot_ops() -> tuple[Callable[..., torch.Tensor] | None, Callable[..., torch.Tensor] | None]:
    """torch.ops.symm_mem's (one_shot_all_reduce_out, one_shot_all_reduce_copy_out), each None
    when this torch lacks it. The copy variant copies the input into the symmetric buffer inside
    the kernel (one launch instead of two)."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (registers the symm_mem ops)
    except ImportError:
        return None, None
    namespace = getattr(torch.ops, "symm_mem", None)

    def op(name: str) -> Callable[..., torch.Tensor] | None:
        return cast("Callable[..., torch.Tensor]", getattr(namespace, name)) if hasattr(namespace, name) else None

    return op("one_shot_all_reduce_out"), op("one_shot_all_reduce_copy_out")


class SymmMemAllReduce:
    """In-place sum over `group` for tensors that `can_reduce` accepts. Build it with `create`
    (collective: every rank of the group calls it, before any CUDA graph is captured)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
                 max_bytes: int) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        self.group, self.device, self.dtype = group, device, dtype
        self.world_size = dist.get_world_size(group)
        self.group_name: str = group.group_name
        itemsize = torch.empty(0, dtype=dtype).element_size()
        self.max_numel = max_bytes // itemsize
        self.itemsize = itemsize
        one_shot, one_shot_copy = _one_shot_ops()
        if one_shot is None:
            raise RuntimeError("torch.ops.symm_mem.one_shot_all_reduce_out is missing")
        self._one_shot, self._one_shot_copy = one_shot, one_shot_copy
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:                     # needed on older torch, deprecated (a no-op) later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable(self.group_name)
        self.buffer = symm_mem.empty(self.max_numel, dtype=dtype, device=device)   # [max_numel]
        # collective: maps every peer's buffer here; the handle keeps the mapping alive
        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)

    @classmethod
    def create(cls, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
               max_bytes: int | None = None) -> SymmMemAllReduce | None:
        """The all-reduce for this rank, or None (use NCCL) when any rank of the group cannot
        use it. Every rank gets the same answer: the ranks agree (an all_reduce MIN) first."""
        world_size = dist.get_world_size(group)
        if device.type != "cuda" or world_size == 1:
            return None                           # same on every rank: no collective needed
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if max_bytes is None:
            max_bytes = DEFAULT_MAX_BYTES if world_size == 2 else MULTI_RANK_MAX_BYTES
        reason = cls._local_problem(group, device, dtype)
        usable = torch.tensor([0 if reason else 1], dtype=torch.int32, device=device)
        dist.all_reduce(usable, op=dist.ReduceOp.MIN, group=group)
        if not int(usable.item()):
            logger.info("custom all-reduce off (NCCL for every size): %s",
                        reason or "another rank cannot use symmetric memory")
            return None
        reducer = cls(group, device, dtype, max_bytes)
        logger.info("custom all-reduce: symmetric-memory one-shot up to %d KiB (%s), NCCL beyond",
                    max_bytes >> 10, dtype)
        return reducer

    @staticmethod
    def _local_problem(group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this rank cannot use symmetric memory (None: it can). Collective (all_gather)."""
        devices = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
        dist.all_gather_into_tensor(devices, torch.tensor([device.index or 0], device=device), group=group)
        if _one_shot_ops()[0] is None:
            return f"torch {torch.__version__} has no symm_mem one_shot_all_reduce_out"
        if dtype not in _DTYPES:
            return f"the one-shot kernel has no {dtype} (only {', '.join(map(str, _DTYPES))})"
        local_world = envs.local_world_size()      # set by torchrun
        if local_world is not None and local_world != devices.numel():
            return "the ranks span several hosts"
        mine, ids = device.index or 0, [int(i) for i in devices.tolist()]
        if ids.count(mine) > 1:
            return f"several ranks see their device as cuda:{mine} (per-rank CUDA_VISIBLE_DEVICES?)"
        for other in ids:
            if other != mine and not torch.cuda.can_device_access_peer(mine, other):
                return f"cuda:{mine} has no peer access to cuda:{other}"
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")   # never NVLS
        return None

    def can_reduce(self, x: torch.Tensor) -> bool:
        """Whether `all_reduce(x)` may take x (else the caller uses NCCL). Depends only on x's
        shape, dtype and device, which are the same on every rank."""
        return (x.dtype == self.dtype and x.device == self.device and x.is_contiguous()
                and 0 < x.numel() <= self.max_numel and (x.numel() * self.itemsize) % _ALIGNMENT == 0)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the group in place (bitwise the same result on every rank); returns x."""
        flat = x.view(-1)                                   # [N]
        staged = self.buffer[:flat.numel()]                 # [N] this rank's symmetric slice
        if self._one_shot_copy is not None:
            # the kernel copies flat into staged, meets the peers, then writes the sum into flat:
            # each thread reads its elements of flat before the barrier and writes them after it
            self._one_shot_copy(staged, flat, "sum", self.group_name, flat)
        else:
            staged.copy_(flat)
            self._one_shot(staged, "sum", self.group_name, flat)
        return x
