"""The environment variables of nv-kernels: the only module of the package that reads the environment.

    NV_FUSED_OPS          auto (default) / on / off: when the fused elementwise kernels run
    NV_PDL                1 (default) / 0: programmatic dependent launch for the decode step's small launches
    NV_SKINNY_GEMM        1 (default) / 0: decode-size GEMMs through nv_kernels.skinny_gemm
    NV_PARALLEL_COMPILE   1 (default) / 0: compile-only passes on a thread pool before the first launches

One function per variable, called when the value is needed: importing this module (or any other of the
package) reads nothing. Each function reads the variable anew and raises ValueError, naming the variable, for a
value it does not accept. Surrounding spaces and case are ignored; an unset or blank variable means its default.
The modules that keep a setting (fused_dispatch, dependent_launch, skinny_gemm) read it on first use and keep it
until their setter changes it; their setter with None forgets it, so the next use reads the variable again.

Triton's own variables that the package reads as well, each through a function here: TRITON_INTERPRET (1: Triton
kernels run in its interpreter, on CPU tensors), TRITON_CACHE_DIR and TRITON_HOME (where compiled kernels are
cached). The engine sets fused ops through its `fused_ops` argument (fused_dispatch.set_fused_ops).
"""
from __future__ import annotations

import os

FUSED_OPS_MODES = ("auto", "on", "off")
_ON = ("1", "on", "true")
_OFF = ("0", "off", "false")


def _value(name: str) -> str:
    """The variable's value, stripped and lower-cased; "" when unset."""
    return os.environ.get(name, "").strip().lower()


def _switch(name: str, default: bool) -> bool:
    """An on / off variable: 1, on, true or 0, off, false; unset or blank: `default`."""
    value = _value(name)
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name}={os.environ[name]!r} is not one of {', '.join(_ON + _OFF)}")


def nv_fused_ops() -> str:
    """NV_FUSED_OPS: when the fused elementwise kernels run (nv_kernels.fused_dispatch). "auto" (default): on CUDA
    tensors; "on": also on CPU tensors under TRITON_INTERPRET=1 (tests); "off": never (torch ops)."""
    value = _value("NV_FUSED_OPS") or "auto"
    if value not in FUSED_OPS_MODES:
        raise ValueError(f"NV_FUSED_OPS={os.environ['NV_FUSED_OPS']!r} is not one of {', '.join(FUSED_OPS_MODES)}")
    return value


def nv_pdl() -> bool:
    """NV_PDL: programmatic dependent launch for the decode step's small launches (nv_kernels.dependent_launch).
    1 / on / true (default): where the device supports it; 0 / off / false: never."""
    return _switch("NV_PDL", True)


def nv_skinny_gemm() -> bool:
    """NV_SKINNY_GEMM: the layers' dispatch of decode-size GEMMs to nv_kernels.skinny_gemm. 1 / on / true
    (default): where it applies; 0 / off / false: torch's GEMM always."""
    return _switch("NV_SKINNY_GEMM", True)


def nv_parallel_compile() -> bool:
    """NV_PARALLEL_COMPILE: compile-only passes on a thread pool (nv_kernels.parallel_compile). 1 / on / true
    (default): where Triton supports them; 0 / off / false: never (kernels compile as they launch)."""
    return _switch("NV_PARALLEL_COMPILE", True)


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton's interpreter runs the kernels (on CPU tensors too)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_interpret_value() -> str | None:
    """TRITON_INTERPRET as set (None when unset), for code that sets it for a while and restores it."""
    return os.environ.get("TRITON_INTERPRET")


def triton_cache_dir() -> str | None:
    """TRITON_CACHE_DIR when set and not empty: where Triton keeps its compiled kernels."""
    return os.environ.get("TRITON_CACHE_DIR") or None


def triton_home() -> str | None:
    """TRITON_HOME when set and not empty: the folder holding `.triton/` (older Triton's cache root)."""
    return os.environ.get("TRITON_HOME") or None
