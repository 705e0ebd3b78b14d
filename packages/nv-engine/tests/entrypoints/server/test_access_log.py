"""`nv serve` logs no line per HTTP request unless --enable-uvicorn-access-log asks for uvicorn's access log."""
from __future__ import annotations

import argparse

import pytest

pytest.importorskip("uvicorn")

from nv_engine.entrypoints.server.cli import add_server_arguments, uvicorn_config  # noqa: E402


def _config(*flags: str):
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return uvicorn_config(object(), parser.parse_args(["model-dir", "--port", "8123", *flags]))


def test_access_log_is_off_by_default_and_on_with_the_flag():
    default = _config()
    assert default.access_log is False and default.port == 8123 and default.log_level == "info"
    assert _config("--enable-uvicorn-access-log").access_log is True
