"""Each package installs with pip into a fresh venv from its own declared dependencies.

(a) nv-kvcache installs without torch and its tests pass against the installed copy.
(b) nv-kernels / nv-layers / nv-qwen3 / nv-llama install next to torch (the local CPU wheel torch==2.13.0 on
    Python 3.11; elsewhere whatever torch pip picks) and their local sibling packages, then import.
Slow-ish (pip, measured on a 2-core machine): about 25 s for (a), 20-35 s per package in (b).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"
TORCH_PIN = "torch==2.13.0"
PIP_TIMEOUT_S = 900


def clean_env() -> dict[str, str]:
    """The caller's environment minus anything that would leak the dev venv into the new one."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd: list[str], cwd: Path, timeout: float = PIP_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def make_venv(path: Path) -> Path:
    proc = run([sys.executable, "-m", "venv", path], cwd=path.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr
    python = path / "bin" / "python"
    assert python.exists(), f"no interpreter in {path}"
    return python


def pip_install(python: Path, args: list, cwd: Path) -> subprocess.CompletedProcess:
    """pip install args, building the local packages without build isolation (one isolated build
    env per local package costs about 7 s each): their build backends are installed first."""
    backends = sorted({req for arg in args if isinstance(arg, Path)
                       for req in tomllib.loads((arg / "pyproject.toml").read_text())["build-system"]["requires"]})
    base = [python, "-m", "pip", "install", "--no-compile", "--progress-bar", "off"]
    if backends:
        proc = run([*base, *backends], cwd=cwd)
        if proc.returncode != 0:
            return proc
    return run([*base, "--no-build-isolation", *args], cwd=cwd)


def sibling_packages(package: str) -> list[Path]:
    """Local package dirs that `package` depends on by name, transitively (siblings are declared by
    name and version range, so pip cannot find them without their paths)."""
    found: list[Path] = []
    todo = [package]
    while todo:
        meta = tomllib.loads((PACKAGES / todo.pop() / "pyproject.toml").read_text())
        for requirement in meta["project"].get("dependencies", []):
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
            path = PACKAGES / name
            if path.is_dir() and path not in found:
                found.append(path)
                todo.append(name)
    return found


def test_nv_kvcache_installs_without_torch_and_its_tests_pass(tmp_path):
    python = make_venv(tmp_path / "venv")
    proc = pip_install(python, [PACKAGES / "nv-kvcache", "pytest", "hypothesis"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = run([python, "-c", "import importlib.util, nv_kvcache; "
                 "print(importlib.util.find_spec('torch') is None, nv_kvcache.__file__)"], cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    no_torch, location = probe.stdout.split()
    assert no_torch == "True", "torch is importable in the nv-kvcache venv"
    assert "site-packages" in location, f"tests would not run against the installed copy: {location}"
    # An empty ini in tmp_path: the repo's pytest.ini is not used, and nothing is cached.
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = run([python, "-m", "pytest", PACKAGES / "nv-kvcache" / "tests", "-q", "-p", "no:cacheprovider",
                "--import-mode=importlib", "-c", tmp_path / "pytest.ini", "--rootdir", tmp_path], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


def torch_requirement() -> str:
    return TORCH_PIN if sys.version_info[:2] == (3, 11) else "torch"


@pytest.mark.parametrize("package", ["nv-kernels", "nv-layers", "nv-qwen3", "nv-llama"])
def test_torch_package_installs_with_its_siblings_and_imports(package, tmp_path):
    python = make_venv(tmp_path / "venv")
    local = [PACKAGES / package, *sibling_packages(package)]
    torch_req = torch_requirement()
    proc = pip_install(python, [torch_req, *local], cwd=tmp_path)
    if proc.returncode != 0 and torch_req == TORCH_PIN and TORCH_PIN in proc.stdout + proc.stderr:
        proc = pip_install(python, ["torch", *local], cwd=tmp_path)     # the pinned wheel is not here
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    module = package.replace("-", "_")
    probe = run([python, "-c", f"import torch, {module}; print(torch.__version__, {module}.__file__)"],
                cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    torch_version, location = probe.stdout.split()[-2:]
    assert "site-packages" in location, location
    if torch_req == TORCH_PIN:
        assert torch_version.startswith("2.13.0"), torch_version
    if package == "nv-llama":  # a model package needs nv-layers, not the other model package
        other = run([python, "-c", "import importlib.util; print(importlib.util.find_spec('nv_qwen3') is None)"],
                    cwd=tmp_path)
        assert other.stdout.split()[-1] == "True", other.stdout + other.stderr
