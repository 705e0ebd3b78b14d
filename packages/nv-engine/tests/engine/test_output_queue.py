"""OutputQueue: a stream's consumer gets everything queued since its last wait, in order, and a consumer
cancelled while it waits loses nothing."""
from __future__ import annotations

import asyncio

from nv_engine.engine.output_queue import OutputQueue


def test_get_all_returns_every_item_queued_in_order():
    async def run() -> list[list[int]]:
        queue = OutputQueue()
        queue.put_nowait(1)
        queue.put_nowait(2)
        first = await queue.get_all()
        waiting = asyncio.ensure_future(queue.get_all())
        await asyncio.sleep(0)                   # the consumer waits now
        queue.put_nowait(3)
        queue.put_nowait(4)                      # before the consumer runs: the same batch
        second = await waiting
        assert queue.empty()
        return [first, second]

    assert asyncio.run(run()) == [[1, 2], [3, 4]]


def test_a_cancelled_wait_loses_nothing():
    async def run() -> list[int]:
        queue = OutputQueue()
        waiting = asyncio.ensure_future(queue.get_all())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        queue.put_nowait(5)
        return await asyncio.wait_for(queue.get_all(), 5)

    assert asyncio.run(run()) == [5]
