"""OutputQueue: one OutputStream's queue of outputs, filled on the event loop and emptied a batch at a time."""
from __future__ import annotations

import asyncio
from typing import Any


class OutputQueue:
    """What asyncio.Queue does for a stream's outputs, with less work per step: one consumer (the stream)
    takes everything queued at once (`get_all`), so a put costs an append and, when the consumer waits,
    one future's result; a wait costs one future. Items are put on the event loop of the consumer
    (`loop.call_soon_threadsafe` from other threads)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []               # of RequestOutput | BaseException
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():                 # done: the consumer was cancelled while it waited
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get_all(self) -> list[Any]:
        """Every item queued, in order, once there is one (waiting for it)."""
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:        # cancelled: no put will look at this future
                    self._waiter = None
        items, self._items = self._items, []
        return items
