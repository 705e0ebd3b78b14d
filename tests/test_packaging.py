"""Each package installs with pip from its own declared dependencies.

(a) nv-kvcache installs without torch into a fresh venv and its tests pass against the installed copy.
(b) nv-kernels / nv-layers / nv-qwen3 / nv-llama install next to torch (the local CPU wheel torch==2.13.0 on
    Python 3.11; elsewhere whatever torch pip picks) and their local sibling packages, then import. They
    share one venv where torch is installed once; before each package is imported, everything outside
    that package's declared dependency closure is uninstalled, so each import sees only what the package
    declares, whatever ran before it.
Slow-ish (pip, measured on a 2-core machine): about 20 s for (a), about 90 s for (b) in all.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import Distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"
TORCH_PIN = "torch==2.13.0"
PIP_TIMEOUT_S = 900
# In dependency order, so each install mostly adds to the one before (any order is correct, only slower).
TORCH_PACKAGES = ["nv-kernels", "nv-layers", "nv-qwen3", "nv-llama"]


def clean_env() -> dict[str, str]:
    """The caller's environment minus anything that would leak the dev venv into the new one. The venv's
    interpreters may write bytecode: pip installs without it, and each later import of torch reuses it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PIP_REQUIRE_VIRTUALENV",
                        "PYTHONDONTWRITEBYTECODE")}
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


def build_backends(packages: list[Path]) -> list[str]:
    return sorted({req for package in packages
                   for req in tomllib.loads((package / "pyproject.toml").read_text())["build-system"]["requires"]})


def pip_install(python: Path, args: list, cwd: Path, backends: bool = True) -> subprocess.CompletedProcess:
    """pip install args, building the local packages without build isolation (one isolated build
    env per local package costs about 7 s each): their build backends are installed first, unless
    `backends` is False (the venv has them already)."""
    needed = build_backends([arg for arg in args if isinstance(arg, Path)]) if backends else []
    base = [python, "-m", "pip", "install", "--no-compile", "--progress-bar", "off"]
    if needed:
        proc = run([*base, *needed], cwd=cwd)
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
    # An empty ini in tmp_path: the repo's pytest.ini is not used, and nothing is cached. The scheduler's
    # stateful property test (300 random workloads, most of this run's time) is left to the main suite,
    # which runs it on the same source; every module it imports is imported here by the other tests.
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = run([python, "-m", "pytest", PACKAGES / "nv-kvcache" / "tests", "-q", "-p", "no:cacheprovider",
                "-k", "not TestScheduler",
                "--import-mode=importlib", "-c", tmp_path / "pytest.ini", "--rootdir", tmp_path], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


def torch_requirement() -> str:
    return TORCH_PIN if sys.version_info[:2] == (3, 11) else "torch"


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def installed(venv: Path) -> dict[str, Distribution]:
    """Canonical name -> distribution, for everything installed in the venv."""
    return {canonicalize_name(dist.metadata["Name"]): dist for dist in distributions(path=[str(site_packages(venv))])}


def closure(dists: dict[str, Distribution], roots: set[str]) -> set[str]:
    """The installed distributions that `roots` need, transitively, as their metadata declares (markers
    evaluated for this interpreter, requested extras included)."""
    needed: set[str] = set()
    todo = [(name, frozenset()) for name in roots]
    seen: set[tuple] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in dists:
            continue
        seen.add((name, extras))
        needed.add(name)
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in {"", *extras}):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return needed


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory):
    """A venv holding pip, the local packages' build backends, and torch. Returns (python, the names
    installed before torch, the torch requirement that installed)."""
    tmp_path = tmp_path_factory.mktemp("torch-packages")
    python = make_venv(tmp_path / "venv")
    backends = build_backends([PACKAGES / name for name in TORCH_PACKAGES])
    proc = pip_install(python, backends, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    base = set(installed(tmp_path / "venv"))
    torch_req = torch_requirement()
    proc = pip_install(python, [torch_req], cwd=tmp_path)
    if proc.returncode != 0 and torch_req == TORCH_PIN and TORCH_PIN in proc.stdout + proc.stderr:
        torch_req = "torch"                                                # the pinned wheel is not here
        proc = pip_install(python, [torch_req], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return python, base, torch_req


@pytest.mark.parametrize("package", TORCH_PACKAGES)
def test_torch_package_installs_with_its_siblings_and_imports(package, torch_venv):
    python, base, torch_req = torch_venv
    venv, cwd = python.parents[1], python.parents[2]
    local = [PACKAGES / package, *sibling_packages(package)]
    proc = pip_install(python, [torch_req, *local], cwd=cwd, backends=False)
    assert proc.returncode == 0, f"{package}: " + proc.stdout[-3000:] + proc.stderr[-3000:]
    # Leave only what the package declares (plus pip and the build backends the venv started with).
    dists = installed(venv)
    extra = sorted(set(dists) - closure(dists, {canonicalize_name(package), *base}))
    if extra:
        proc = run([python, "-m", "pip", "uninstall", "-y", *extra], cwd=cwd)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    module = package.replace("-", "_")
    probe = run([python, "-c", f"import torch, {module}; print(torch.__version__, {module}.__file__)"], cwd=cwd)
    assert probe.returncode == 0, f"{package} does not import from its declared dependencies:\n" + probe.stderr[-3000:]
    torch_version, location = probe.stdout.split()[-2:]
    assert "site-packages" in location, location
    if torch_req == TORCH_PIN:
        assert torch_version.startswith("2.13.0"), torch_version
    if package == "nv-llama":  # a model package needs nv-layers, not the other model package
        other = run([python, "-c", "import importlib.util; print(importlib.util.find_spec('nv_qwen3') is None)"],
                    cwd=cwd)
        assert other.stdout.split()[-1] == "True", other.stdout + other.stderr
