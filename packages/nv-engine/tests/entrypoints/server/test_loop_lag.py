"""LoopLagWatcher: a loop blocked by synchronous work shows up as wake-up lag in its report."""
import asyncio
import logging
import time

from nv_engine.entrypoints.server.loop_lag import LoopLagWatcher


def test_a_blocked_event_loop_is_reported_as_lag():
    watcher = LoopLagWatcher(logging.getLogger("test-loop-lag"), period_s=0.005, interval_s=3600.0)

    async def main() -> None:
        watcher.start()
        await asyncio.sleep(0.05)          # the watcher wakes on time
        time.sleep(0.08)                   # synchronous work holds the loop (a collection, a long parse)
        await asyncio.sleep(0.05)
        watcher.stop()

    asyncio.run(main())
    lags = sorted(watcher.lags)
    assert len(lags) >= 5
    assert lags[-1] >= 0.06                # the blocked wake-up came >= 60 ms late
    assert lags[len(lags) // 2] < 0.03     # the others on time
    line = watcher.report(0.2)
    assert "max" in line and float(line.rsplit("max ", 1)[1]) >= 60.0
    assert watcher.lags == [] and watcher.lines[-1] == line
    assert watcher.report(1.0) == "event loop: no wake-ups in 1.0 s"
