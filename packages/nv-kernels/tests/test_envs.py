"""nv_kernels.envs: each variable's default, the values it accepts, a ValueError naming it for any other value; and
importing the package reads none of them."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from nv_kernels import envs

SWITCHES: list[tuple[str, Callable[[], bool]]] = [
    ("NV_PDL", envs.nv_pdl),
    ("NV_SKINNY_GEMM", envs.nv_skinny_gemm),
    ("NV_PARALLEL_COMPILE", envs.nv_parallel_compile),
]
ALL = [("NV_FUSED_OPS", envs.nv_fused_ops), *SWITCHES]


@pytest.mark.parametrize("name,read", ALL)
def test_unset_or_blank_is_the_default(monkeypatch: pytest.MonkeyPatch, name: str, read: Callable[[], object]
                                       ) -> None:
    default = "auto" if name == "NV_FUSED_OPS" else True
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, "  ")
    assert read() == default


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("on", "on"), ("off", "off"), (" OFF ", "off"),
                                            ("On", "on")])
def test_fused_ops_modes(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    monkeypatch.setenv("NV_FUSED_OPS", value)
    assert envs.nv_fused_ops() == expected


@pytest.mark.parametrize("name,read", SWITCHES)
@pytest.mark.parametrize("value,expected", [("1", True), ("on", True), ("true", True), (" ON ", True),
                                            ("0", False), ("off", False), ("false", False), ("False", False)])
def test_switch_values(monkeypatch: pytest.MonkeyPatch, name: str, read: Callable[[], bool], value: str,
                       expected: bool) -> None:
    monkeypatch.setenv(name, value)
    assert read() is expected


@pytest.mark.parametrize("name,read", ALL)
@pytest.mark.parametrize("value", ["maybe", "2", "yes please"])
def test_a_bad_value_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch, name: str,
                                                read: Callable[[], object], value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        read()


def test_each_read_sees_the_environment_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_PDL", "0")
    assert envs.nv_pdl() is False
    monkeypatch.setenv("NV_PDL", "1")
    assert envs.nv_pdl() is True


def test_importing_the_package_reads_no_variable() -> None:
    """Bad values everywhere: the imports still succeed (nothing is read until a value is needed)."""
    modules = ["nv_kernels", "nv_kernels.envs", "nv_kernels.fused_dispatch", "nv_kernels.dependent_launch",
               "nv_kernels.skinny_gemm", "nv_kernels.parallel_compile", "nv_kernels.triton_backend"]
    env = {**os.environ, **{name: "bad" for name, _ in ALL}}
    result = subprocess.run([sys.executable, "-c", "; ".join(f"import {m}" for m in modules)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
