"""Lint and type checks over the repository: `ruff check` (ruff.toml) and `basedpyright` (pyrightconfig.json).
A finding fails the test with the tool's own report. Skipped where a tool is not installed (hatch's test
environment installs both)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """The tool's executable: beside this Python first (a venv's bin dir), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing():
    result = run([tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."], timeout=120)
    assert result.returncode == 0, f"ruff check:\n{result.stdout}{result.stderr}"


@pytest.mark.slow  # about a minute on two cores
def test_basedpyright_finds_nothing():
    # --pythonpath: the environment whose packages (torch, transformers ...) the checked code imports
    result = run([tool("basedpyright"), "--pythonpath", sys.executable], timeout=900)
    assert result.returncode == 0, f"basedpyright:\n{result.stdout}{result.stderr}"
