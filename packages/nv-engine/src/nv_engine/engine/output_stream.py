"""OutputStream: the RequestOutputs of one or more engine requests, merged in arrival order."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from nv_engine.engine.output_queue import OutputQueue
from nv_engine.engine.outputs import RequestOutput


class Aborter(Protocol):
    def abort(self, request_id: str) -> None: ...


class OutputStream:
    """Iterate it for lists of RequestOutput (everything queued since the last wait; each output
    holds its request's full text so far). An exception put in the queue (the engine failed, the
    core refused the request) is raised. Leaving the iteration early (client gone, task cancelled,
    error) aborts the requests not finished yet."""

    def __init__(self, engine: Aborter, request_ids: list[str], out_queue: OutputQueue) -> None:
        self._engine = engine
        self._queue = out_queue      # of RequestOutput | BaseException
        self.unfinished = set(request_ids)
        # the engine core each request went to, in order (data parallelism); None when not known
        self.engine_indices: list[int] | None = None

    async def next_outputs(self) -> list[RequestOutput]:
        items: list[RequestOutput] = await self._queue.get_all()
        for item in items:
            if isinstance(item, BaseException):
                self.abort()                # the others of this call end too
                raise item
            if item.finished:
                self.unfinished.discard(item.request_id)
        return items

    def abort(self) -> None:
        for request_id in self.unfinished:
            self._engine.abort(request_id)
        self.unfinished.clear()

    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        try:
            while self.unfinished:
                yield await self.next_outputs()
        finally:
            self.abort()
