"""Backend registry: pick an AttentionBackend by name and device, or per phase by measurement."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Literal

import torch

from nv_kernels import envs
from nv_kernels.interface import AttentionBackend

BACKEND_NAMES = ("flash_attn", "triton", "torch")
Phase = Literal["prefill", "decode"]
# The default backend of each attention phase on CUDA, fastest first; the first available one serves the
# phase (Triton always is on CUDA). benchmarks/attention_backend_sweep.py measures the candidates per phase
# (Qwen3-0.6B attention shape). On an H200 (BENCHMARKS.md) FlashAttention-4 won only long fresh prefills
# (1x8192: 419 against 870 us) and lost short and cached-prefix chunks (64x128: 218 against 88 us) and every
# decode (batch 1, 4k context: 49 against 10 us); the headline ran 5% slower with it and the engine started
# 21 s later (import and kernel compiles). So Triton serves both phases; attention_backend="flash_attn" opts in.
FASTEST_ON_CUDA: dict[Phase, tuple[str, ...]] = {
    "prefill": ("triton",),
    "decode": ("triton",),
}
# FlashAttention-4's paged-KV forward exists for these compute capability majors (Hopper, Blackwell).
FLASH_ATTN4_MAJORS = (9, 10, 11)
FLASH_ATTN_EXTRA = "pip install 'nv-kernels[flash-attn]'"
_instances: dict[str, AttentionBackend] = {}


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of the CUDA device, None when this torch sees no CUDA device."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _import_error(module: str) -> str | None:
    """None when `module` imports, else why not."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken install raises more than ImportError (missing CUDA libraries)
        return f"{type(exc).__name__}: {exc}"
    return None


def _flash_attn2_importable() -> bool:
    """flash-attn 2's API at the package top (FlashAttention-4 alone installs flash_attn as a namespace)."""
    if _import_error("flash_attn") is not None:
        return False
    module = importlib.import_module("flash_attn")
    return hasattr(module, "flash_attn_varlen_func") and hasattr(module, "flash_attn_with_kvcache")


def _flash_attn_variant(device: torch.device) -> tuple[str | None, str]:
    """("flash_attn4" | "flash_attn2", "") for the flash-attn build that runs on `device`, else (None, why)."""
    if device.type != "cuda":
        return None, f"flash_attn needs a CUDA device (got {device})"
    capability = _cuda_capability(device)
    if capability is None:
        return None, f"no CUDA device is visible; {FLASH_ATTN_EXTRA} on a Hopper or Blackwell GPU machine"
    major, minor = capability
    if major in FLASH_ATTN4_MAJORS:
        fa4_error = _import_error("flash_attn.cute")
        if fa4_error is None:
            return "flash_attn4", ""
        fa4_why = f"flash_attn.cute (FlashAttention-4) does not import ({fa4_error})"
    else:
        fa4_why = (f"FlashAttention-4's paged attention needs a Hopper or Blackwell GPU (compute capability "
                   f"9.x-11.x), this one is {major}.{minor}")
    if _flash_attn2_importable():
        return "flash_attn2", ""
    return None, f"{fa4_why}, and flash-attn 2 is not installed; {FLASH_ATTN_EXTRA} installs FlashAttention-4"


def _unavailable_reason(name: str, device: torch.device) -> str | None:
    """None when backend `name` can run on `device`, else why not."""
    if name == "torch":
        return None
    if name == "triton":
        if not _has_module("triton"):
            return "the triton package is not installed"
        if device.type == "cuda":
            return None
        if envs.triton_interpret():
            return None
        return f"triton kernels need a CUDA device (got {device}); set TRITON_INTERPRET=1 to interpret on CPU"
    if name == "flash_attn":
        return _flash_attn_variant(device)[1] or None
    raise ValueError(f"unknown attention backend {name!r}; known: {', '.join(BACKEND_NAMES)}")


def _create(key: str) -> AttentionBackend:
    if key == "torch":
        from nv_kernels.torch_backend import TorchBackend

        return TorchBackend()
    if key == "triton":
        from nv_kernels.triton_backend import TritonBackend

        return TritonBackend()
    if key == "flash_attn4":
        from nv_kernels.flash_attn4_backend import FlashAttn4Backend

        return FlashAttn4Backend()
    from nv_kernels.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


def _instance(name: str, device: torch.device) -> AttentionBackend:
    """The shared instance of available backend `name` (flash_attn: the variant `device` runs)."""
    key = name if name != "flash_attn" else _flash_attn_variant(device)[0] or name
    if key not in _instances:
        _instances[key] = _create(key)
    return _instances[key]


def fastest_for_phase(phase: Phase, device: torch.device | str) -> str:
    """The backend name that serves `phase` by default on `device` (FASTEST_ON_CUDA, then triton; torch off CUDA)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "torch"
    candidates = (*FASTEST_ON_CUDA[phase], "triton")
    return next((n for n in candidates if _unavailable_reason(n, dev) is None), "torch")


def get_backend(name: str | None = None, device: torch.device | str | None = None) -> AttentionBackend:
    """Return the backend `name` for `device`.

    "flash_attn" is FlashAttention-4 when `flash_attn.cute` imports on a Hopper/Blackwell GPU, else
    flash-attn 2 when its API imports. None picks per phase on CUDA (FASTEST_ON_CUDA; one backend, or a
    PhaseSplitBackend when prefill and decode differ), "torch" elsewhere.
    Unknown or unavailable names raise ValueError naming the backend and why.
    """
    dev = _default_device() if device is None else torch.device(device)
    if name is None:
        prefill, decode = fastest_for_phase("prefill", dev), fastest_for_phase("decode", dev)
        if prefill != decode:
            from nv_kernels.phase_split_backend import PhaseSplitBackend

            key = f"prefill:{prefill},decode:{decode}"
            if key not in _instances:
                _instances[key] = PhaseSplitBackend(_instance(prefill, dev), _instance(decode, dev))
            return _instances[key]
        name = prefill
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or None, got {type(name).__name__}")
    reason = _unavailable_reason(name, dev)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} is unavailable: {reason}")
    return _instance(name, dev)


def available_backends() -> list[str]:
    """Names that get_backend(name) accepts on the default device (CUDA when present, else CPU)."""
    dev = _default_device()
    return [n for n in BACKEND_NAMES if _unavailable_reason(n, dev) is None]
