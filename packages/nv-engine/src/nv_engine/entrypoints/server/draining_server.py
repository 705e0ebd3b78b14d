"""uvicorn's server with a graceful drain on SIGTERM / SIGINT (see app.begin_drain)."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from types import FrameType

import uvicorn

from nv_engine.entrypoints.server.app import begin_drain
from nv_engine.entrypoints.server.serving import ServerState

logger = logging.getLogger("nv_engine.entrypoints.server")


class DrainingServer(uvicorn.Server):
    """On the first exit signal: new /v1 requests get a 503, requests in flight get
    `limits.shutdown_timeout_s` to finish, then the rest end with an error; uvicorn closes the
    listening socket meanwhile and waits (its graceful timeout is set a little longer).

    exit_when_engine_dies: once the engine is dead (its core process gone) the server exits,
    `engine_death_grace_s` later (open streams get their error event, /health answers 503
    meanwhile), so a supervisor restarts it; `nv serve` then exits non-zero."""

    def __init__(self, config: uvicorn.Config, state: ServerState, *, exit_when_engine_dies: bool = False,
                 engine_death_grace_s: float = 5.0) -> None:
        config.timeout_graceful_shutdown = math.ceil(state.limits.shutdown_timeout_s) + 5   # uvicorn: whole seconds
        super().__init__(config)
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_when_engine_dies = exit_when_engine_dies
        self.engine_death_grace_s = engine_death_grace_s
        self._engine_dead_since: float | None = None

    async def on_tick(self, counter: int) -> bool:
        """uvicorn calls this every 0.1 s; True ends the server."""
        if self.exit_when_engine_dies and self.started and not self.state.engine.is_alive:
            now = time.monotonic()
            if self._engine_dead_since is None:
                self._engine_dead_since = now
                logger.error("the engine is dead: the server exits in %.0f s", self.engine_death_grace_s)
            elif now - self._engine_dead_since >= self.engine_death_grace_s:
                self.should_exit = True
        return await super().on_tick(counter)

    async def startup(self, sockets: list | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.loop is not None and not self.state.draining:
            begin_drain(self.state, self.loop)
        super().handle_exit(sig, frame)
