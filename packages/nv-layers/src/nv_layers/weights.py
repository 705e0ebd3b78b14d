"""Helpers that let weight loaders take either a tensor or a lazy safetensors slice.

`safe_open(...).get_slice(name)` returns an object that reads only the indexed bytes, so a rank
that needs one shard of a weight reads just that shard (idea: vLLM's sharded loading).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

WeightLike = Any  # torch.Tensor or a safetensors slice (get_shape(), __getitem__)


def shape_of(weight: WeightLike) -> tuple[int, ...]:
    if isinstance(weight, torch.Tensor):
        return tuple(weight.shape)
    return tuple(weight.get_shape())


def read_full(weight: WeightLike) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        return weight
    return weight[:]


def read_shard(weight: WeightLike, dim: int, start: int, size: int) -> torch.Tensor:
    """weight.narrow(dim, start, size), reading only that part from a lazy slice."""
    if isinstance(weight, torch.Tensor):
        return weight.narrow(dim, start, size)
    index = [slice(None)] * len(shape_of(weight))
    index[dim] = slice(start, start + size)
    return weight[tuple(index)]


def check_shape(weight: WeightLike, expected: tuple[int, ...], what: str) -> None:
    """ValueError unless the whole checkpoint tensor has `expected` shape (checked before any
    shard is cut, so a larger tensor is never silently narrowed to fit)."""
    found = shape_of(weight)
    if tuple(found) != tuple(expected):
        raise ValueError(f"{what}: expected shape {tuple(expected)} from the model config, found {tuple(found)}")


def copy_checked(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    """dst.copy_(src) with a ValueError naming `what` on a shape mismatch."""
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"{what}: checkpoint shape {tuple(src.shape)} does not match {tuple(dst.shape)}")
    dst.copy_(src)


def default_weight_loader(param: torch.nn.Parameter, loaded_weight: WeightLike) -> None:
    """Loader for unsharded parameters: the whole tensor, same shape."""
    copy_checked(param.data, read_full(loaded_weight), "weight")


def set_weight_loader(param: torch.nn.Parameter, loader: Callable[..., None]) -> None:
    """Attach `loader` as param.weight_loader (the checkpoint loaders call it); torch's Parameter type does not
    declare the attribute, hence setattr."""
    setattr(param, "weight_loader", loader)  # noqa: B010
