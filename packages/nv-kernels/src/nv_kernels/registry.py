"""Backend registry: pick an AttentionBackend by name and device."""
from __future__ import annotations

import importlib.util
import os

import torch

from nv_kernels.interface import AttentionBackend

BACKEND_NAMES = ("flash_attn", "triton", "torch")
_instances: dict[str, AttentionBackend] = {}


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _unavailable_reason(name: str, device: torch.device) -> str | None:
    """None when backend `name` can run on `device`, else why not."""
    if name == "torch":
        return None
    if name == "triton":
        if not _has_module("triton"):
            return "the triton package is not installed"
        if device.type == "cuda":
            return None
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return f"triton kernels need a CUDA device (got {device}); set TRITON_INTERPRET=1 to interpret on CPU"
    if name == "flash_attn":
        if not _has_module("flash_attn"):
            return "the flash_attn package is not installed"
        if device.type != "cuda":
            return f"flash_attn needs a CUDA device (got {device})"
        return None
    raise ValueError(f"unknown attention backend {name!r}; known: {', '.join(BACKEND_NAMES)}")


def _create(name: str) -> AttentionBackend:
    if name == "torch":
        from nv_kernels.torch_backend import TorchBackend

        return TorchBackend()
    if name == "triton":
        from nv_kernels.triton_backend import TritonBackend

        return TritonBackend()
    from nv_kernels.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


def get_backend(name: str | None = None, device: torch.device | str | None = None) -> AttentionBackend:
    """Return the backend `name` for `device`.

    None picks "flash_attn" if importable on CUDA, else "triton" on CUDA, else "torch".
    Unknown or unavailable names raise ValueError naming the backend and why.
    """
    dev = _default_device() if device is None else torch.device(device)
    if name is None:
        name = next(n for n in BACKEND_NAMES if _unavailable_reason(n, dev) is None and (
            n == "torch" or dev.type == "cuda"))
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or None, got {type(name).__name__}")
    reason = _unavailable_reason(name, dev)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} is unavailable: {reason}")
    if name not in _instances:
        _instances[name] = _create(name)
    return _instances[name]


def available_backends() -> list[str]:
    """Names that get_backend(name) accepts on the default device (CUDA when present, else CPU)."""
    dev = _default_device()
    return [n for n in BACKEND_NAMES if _unavailable_reason(n, dev) is None]
