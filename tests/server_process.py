"""A server started as a subprocess (`nv serve ...`): awaited until its /health answers 200, stopped as Ctrl-C does."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import httpx


def wait_until_healthy(proc: subprocess.Popen, url: str, timeout_s: float, output: Callable[[], str]) -> None:
    """Poll `url`/health until it answers 200. AssertionError with the server's `output()` when the process exits
    first, and when `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{output()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not come up in {timeout_s:.0f} s")
        time.sleep(0.2)


def stop_with_sigint(proc: subprocess.Popen, timeout_s: float = 30) -> int:
    """Stop the server as Ctrl-C does and return its exit status; kill it (and raise) if it outlives `timeout_s`."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
