"""Run an app on a free loopback port in a background thread (the server tests)."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", startup_timeout: float = 60.0) -> Iterator[str]:
    """Serve `app` until the block exits; yields its base URL (http://127.0.0.1:PORT). An nv app
    (one with `app.state.nv`) runs under DrainingServer, kept as `app.state.server`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    state = getattr(getattr(app, "state", None), "nv", None)
    if state is not None:
        from nv_engine.entrypoints.server.draining_server import DrainingServer

        server: uvicorn.Server = DrainingServer(config, state)
        app.state.server = server
    else:
        server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="nv-test-server")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server thread exited during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError("the server did not start in time")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
