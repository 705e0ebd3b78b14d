"""Tensor-parallel state read from torch.distributed.

The tensor-parallel group is the whole default process group (one engine = one TP group).
Without an initialised process group every layer runs unsharded: rank 0, size 1, group None.
`tp_all_reduce` takes small CUDA tensors through the symmetric-memory all-reduce once
`init_custom_all_reduce` set it up (nv_layers.custom_all_reduce), everything else through NCCL
(gloo on CPU).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from nv_layers.custom_all_reduce import SymmMemAllReduce

_custom_all_reduce: SymmMemAllReduce | None = None
_tp_group_aborted = False   # a peer died: device work waiting on it never finishes
_kept_after_abort: list[SymmMemAllReduce] = []   # buffers a hung kernel may still use: never freed


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_tp_rank() -> int:
    return dist.get_rank() if _initialised() else 0


def get_tp_size() -> int:
    return dist.get_world_size() if _initialised() else 1


def get_tp_group() -> dist.ProcessGroup | None:
    return dist.group.WORLD if _initialised() else None


def divide(numerator: int, denominator: int, what: str) -> int:
    """numerator // denominator; ValueError naming `what` when it does not divide evenly."""
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})"
        )
    return numerator // denominator


def init_custom_all_reduce(device: torch.device, dtype: torch.dtype, max_bytes: int | None = None) -> bool:
    """Set up the symmetric-memory all-reduce for `dtype` tensors on `device` (collective: every
    TP rank calls it, before CUDA graphs are captured). False, and NCCL for every size, at TP=1,
    on CPU, or when a rank cannot use it."""
    global _custom_all_reduce, _tp_group_aborted
    group = get_tp_group()
    _custom_all_reduce = None
    _tp_group_aborted = False
    if group is None or get_tp_size() == 1:
        return False
    _custom_all_reduce = SymmMemAllReduce.create(group, device, dtype, max_bytes)
    return _custom_all_reduce is not None


def release_custom_all_reduce() -> None:
    """Drop the symmetric-memory all-reduce (before the process group goes away). After an abort
    its buffer is kept: a kernel spinning on the dead peer may still read it."""
    global _custom_all_reduce
    if _tp_group_aborted and _custom_all_reduce is not None:
        _kept_after_abort.append(_custom_all_reduce)
    _custom_all_reduce = None


def mark_tp_group_aborted() -> None:
    """A peer of the TP group died (the group was aborted). NCCL's kernels return on an abort, but
    the symmetric-memory kernel's barrier spins on the dead peer forever: host code that waits for
    the device (the runner) polls `tp_group_aborted()` instead of blocking."""
    global _tp_group_aborted
    _tp_group_aborted = True


def tp_group_aborted() -> bool:
    return _tp_group_aborted


def custom_all_reduce() -> SymmMemAllReduce | None:
    """The symmetric-memory all-reduce in use, if any."""
    return _custom_all_reduce


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the TP group in place (no-op at TP=1); returns x. Every rank gets bitwise the same
    sum (the symmetric-memory kernel adds in rank order; NCCL's ring reduces each chunk once and
    broadcasts it)."""
    if get_tp_size() > 1:
        custom = _custom_all_reduce
        if custom is not None and custom.can_reduce(x):
            return custom.all_reduce(x)
        dist.all_reduce(x, group=get_tp_group())
    return x


def tp_all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's x along the last dim, in rank order (identity at TP=1)."""
    size = get_tp_size()
    if size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=get_tp_group())
    return torch.cat(parts, dim=-1)
