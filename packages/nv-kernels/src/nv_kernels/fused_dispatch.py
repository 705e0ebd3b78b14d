"""When the fused elementwise kernels (fused_norm, fused_rope, fused_act) run instead of torch ops.

Mode "auto" (default): the Triton kernels run on CUDA tensors, torch everywhere else. "off": torch
always (A/B benchmarks, debugging). "on": Triton also for CPU tensors when TRITON_INTERPRET=1 (tests
of the wiring at tiny shapes). The environment variable NV_FUSED_OPS sets the starting mode.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

MODES = ("auto", "on", "off")

try:
    import triton as _triton
except ImportError:  # pragma: no cover - platforms without triton: torch path only
    _triton = None


def _mode_from_env() -> str:
    mode = os.environ.get("NV_FUSED_OPS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"NV_FUSED_OPS={mode!r} is not one of {', '.join(MODES)}")
    return mode


_mode = _mode_from_env()


def triton_jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """triton.jit (bare or with options such as do_not_specialize) when triton imports; the kernel is
    then interpreted iff TRITON_INTERPRET=1 now. Without triton the function itself."""
    if fn is None:
        return lambda f: triton_jit(f, **options)
    return _triton.jit(fn, **options) if _triton is not None else fn


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def get_fused_ops() -> str:
    return _mode


def set_fused_ops(mode: str) -> str:
    """Set the mode ("auto" / "on" / "off"); returns the previous one."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"fused ops mode must be one of {', '.join(MODES)}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


@contextmanager
def fused_ops(mode: str) -> Iterator[None]:
    previous = set_fused_ops(mode)
    try:
        yield
    finally:
        set_fused_ops(previous)


def fused_ops_enabled(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernels should run on these tensors (all on one device)."""
    if _mode == "off" or _triton is None or not tensors:
        return False
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        return False
    if device.type == "cuda":
        return True
    return _mode == "on" and os.environ.get("TRITON_INTERPRET") == "1"


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreted_copy(module_name: str) -> ModuleType:
    """A private copy of a fused-kernel module whose kernels run in Triton's interpreter (tests on CPU).

    Triton picks interpretation when a kernel is defined, so the copy is executed with TRITON_INTERPRET=1
    whatever mode the imported module got. The fused modules only call jit helpers defined in themselves.
    """
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no module {module_name!r}")
    copy_spec = importlib.util.spec_from_file_location(f"{module_name}__interpreted", spec.origin)
    if copy_spec is None or copy_spec.loader is None:
        raise ValueError(f"cannot load {spec.origin} as a module")
    module = importlib.util.module_from_spec(copy_spec)
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        copy_spec.loader.exec_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module
