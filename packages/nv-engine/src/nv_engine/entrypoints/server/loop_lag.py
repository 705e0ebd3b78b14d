"""LoopLagWatcher: how late the server's event loop wakes up, the stage of a stream's timeline that
the engine's own timers do not see.

A stream's token goes: engine core step -> OUTPUTS message -> the receiver thread (decode, process,
deliver: its StageTimer) -> `call_soon_threadsafe` onto the event loop -> the handler's SSE write.
When the loop is busy (HTTP parsing, SSE encoding for hundreds of streams, a garbage collection,
the receiver thread holding the GIL) the last hop waits, and tokens reach the client in bursts even
though the core produced them one step apart. The watcher sleeps `period_s` in a task and records how
much later than asked it woke; every `interval_s` it logs at DEBUG the wake-ups and the lag's
p50 / p99 / max, e.g.

    event loop: 987 wake-ups in 10.0 s, lag ms p50 0.08 p99 4.10 max 38.20
"""
from __future__ import annotations

import asyncio
import logging
import time


class LoopLagWatcher:
    """`start()` on the loop to watch (a task that wakes every period_s), `stop()` to end it;
    `lags` holds the current interval's lags in seconds, `lines` the last reports."""

    def __init__(self, logger: logging.Logger, *, period_s: float = 0.01, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.period_s = period_s
        self.interval_s = interval_s
        self.lags: list[float] = []
        self.lines: list[str] = []          # the last few reports (kept for tests and benchmarks)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="nv-loop-lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        interval_start = time.perf_counter()
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.period_s)
            now = time.perf_counter()
            self.lags.append(max(0.0, now - asked - self.period_s))
            if now - interval_start >= self.interval_s:
                self.report(now - interval_start)
                interval_start = now

    def report(self, elapsed_s: float) -> str:
        """The interval's summary line (logged at DEBUG); starts a new interval."""
        lags = sorted(self.lags)
        self.lags = []
        if not lags:
            line = f"event loop: no wake-ups in {elapsed_s:.1f} s"
        else:
            def at(q: float) -> float:
                return lags[min(len(lags) - 1, int(q * len(lags)))] * 1e3
            line = (f"event loop: {len(lags)} wake-ups in {elapsed_s:.1f} s, lag ms p50 {at(0.5):.2f} "
                    f"p99 {at(0.99):.2f} max {lags[-1] * 1e3:.2f}")
        self.lines = [*self.lines[-9:], line]
        self.logger.debug("%s", line)
        return line
