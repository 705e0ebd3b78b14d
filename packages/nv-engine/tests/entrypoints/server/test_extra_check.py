"""`nv serve` without the serve extra ends before the engine starts, naming the missing package; with it, the check
imports none of the extra's packages (their imports run beside the engine's start)."""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

import pytest

from nv_engine.entrypoints.server import cli as server_cli


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server_cli.add_server_arguments(parser)
    return parser.parse_args(["model-dir", *flags])


def test_a_missing_serve_extra_ends_the_command_naming_it(monkeypatch):
    find_spec = importlib.util.find_spec

    def without_uvicorn(name, *args):
        return None if name == "uvicorn" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_uvicorn)
    monkeypatch.setattr(server_cli, "create_async_llm", lambda *a, **k: pytest.fail("the engine started"))
    with pytest.raises(SystemExit, match=r"pip install 'nv-engine\[serve\]' \(No module named 'uvicorn'\)"):
        server_cli.run_server(_args())


def test_the_check_imports_no_serve_package():
    code = ("import sys, argparse\n"
            "from nv_engine.entrypoints.server import cli\n"
            "cli.create_async_llm = lambda *a, **k: sys.exit(0 if not {'fastapi', 'uvicorn'} & set(sys.modules) "
            "else 'imported before the engine start')\n"
            "cli.import_server_modules = lambda: None\n"
            "p = argparse.ArgumentParser(); cli.add_server_arguments(p)\n"
            "cli.run_server(p.parse_args(['model-dir']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
