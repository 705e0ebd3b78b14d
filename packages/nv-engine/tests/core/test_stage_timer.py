"""StageTimer: per-round means of each stage over an interval, one DEBUG line per interval, then a reset."""
from __future__ import annotations

import logging

from nv_engine.core.stage_timer import StageTimer


def test_means_per_round_and_one_line_per_interval(caplog):
    logger = logging.getLogger("nv_engine.test_stage_timer")
    timer = StageTimer("core loop", "step", ("step", "device wait", "outputs"), logger, interval_s=10.0,
                       notes={"step": "device wait"}, started_at=0.0)
    for now in (1.0, 2.0, 3.0, 4.0):
        timer.add("step", 0.010)
        timer.add("device wait", 0.006)
        timer.add("outputs", 0.001)
        timer.end_round(now)
    assert timer.rounds == 4
    assert timer.per_round_ms() == {"step": 10.0, "device wait": 6.0, "outputs": 1.0}
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        timer.add("step", 0.030)
        timer.end_round(10.0)                       # the interval is over: logged and reset
    assert caplog.messages == ["core loop: 5 steps in 10.0 s, ms per step: step 14.000 (device wait 4.800), "
                               "outputs 0.800"]
    assert timer.lines == caplog.messages
    assert timer.rounds == 0 and timer.per_round_ms() == {"step": 0.0, "device wait": 0.0, "outputs": 0.0}
