"""Tensor-parallel state read from torch.distributed.

The tensor-parallel group is the whole default process group (one engine = one TP group).
Without an initialised process group every layer runs unsharded: rank 0, size 1, group None.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


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


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the TP group in place (no-op at TP=1); returns x."""
    if get_tp_size() > 1:
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
