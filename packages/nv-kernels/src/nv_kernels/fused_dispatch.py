"""When the fused elementwise kernels (fused_norm, fused_rope, fused_act) run instead of torch ops.

Mode "auto" (default): the Triton kernels run on CUDA tensors, torch everywhere else. "off": torch
always (A/B benchmarks, debugging). "on": Triton also for CPU tensors when TRITON_INTERPRET=1 (tests
of the wiring at tiny shapes). Until `set_fused_ops` sets one, the mode is NV_FUSED_OPS (nv_kernels.envs),
read at the first use.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from nv_kernels import envs

MODES = envs.FUSED_OPS_MODES

try:
    import triton as _triton
except ImportError:  # pragma: no cover - platforms without triton: torch path only
    _triton = None


_mode: str | None = None   # None: neither set nor read yet (the next use reads NV_FUSED_OPS)


def triton_jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """triton.jit (bare or with options such as do_not_specialize) when triton imports; the kernel is
    then interpreted iff TRITON_INTERPRET=1 now. Without triton the function itself."""
    if fn is None:
        return lambda f: triton_jit(f, **options)
    return _triton.jit(fn, **options) if _triton is not None else fn


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def get_fused_ops() -> str:
    """The mode: the one `set_fused_ops` set, else NV_FUSED_OPS (read now, then kept)."""
    global _mode
    if _mode is None:
        _mode = envs.nv_fused_ops()
    return _mode


def set_fused_ops(mode: str | None) -> str | None:
    """Set the mode ("auto" / "on" / "off"; None: forget it, so the next use reads NV_FUSED_OPS again); returns
    the previous setting, None when the mode was neither set nor read yet. Reads no environment variable: a
    setting made here wins over NV_FUSED_OPS."""
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"fused ops mode must be one of {', '.join(MODES)}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


@contextmanager
def fused_ops(mode: str | None) -> Iterator[None]:
    previous = set_fused_ops(mode)
    try:
        yield
    finally:
        set_fused_ops(previous)


def fused_ops_enabled(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernels should run on these tensors (all on one device)."""
    mode = _mode if _mode is not None else get_fused_ops()
    if mode == "off" or _triton is None or not tensors:
        return False
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        return False
    if device.type == "cuda":
        return True
    return mode == "on" and envs.triton_interpret()


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
    previous = envs.triton_interpret_value()
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        copy_spec.loader.exec_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module
