"""uvicorn's server with a graceful drain on SIGTERM / SIGINT (see app.begin_drain)."""
from __future__ import annotations

import asyncio
import math
from types import FrameType

import uvicorn

from nv_engine.entrypoints.server.app import begin_drain
from nv_engine.entrypoints.server.serving import ServerState


class DrainingServer(uvicorn.Server):
    """On the first exit signal: new /v1 requests get a 503, requests in flight get
    `limits.shutdown_timeout_s` to finish, then the rest end with an error; uvicorn closes the
    listening socket meanwhile and waits (its graceful timeout is set a little longer)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        config.timeout_graceful_shutdown = math.ceil(state.limits.shutdown_timeout_s) + 5   # uvicorn: whole seconds
        super().__init__(config)
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.loop is not None and not self.state.draining:
            begin_drain(self.state, self.loop)
        super().handle_exit(sig, frame)
