"""StageTimer: where a loop's time goes, per named stage, summed over an interval and logged as one line.

Cheap enough to leave on (a perf_counter pair and a dict update per stage and round): the engine
core's loop uses it for step / outputs / inputs / idle, the frontend's receiver for decode /
process / deliver. Every `interval_s` with at least one round it logs, at DEBUG, the rounds and
the mean milliseconds per round of each stage, e.g.

    engine core loop: 1052 steps in 10.0 s, ms per step: step 9.120 (device wait 7.801), outputs 0.190, ...
"""
from __future__ import annotations

import logging
import time


class StageTimer:
    """`add(stage, seconds)` as the stages run, `end_round()` once per round (a step, a message).
    Stage names are fixed at construction (their order is the log line's); `totals` and `rounds`
    hold the current interval's sums."""

    def __init__(self, title: str, round_name: str, stages: tuple[str, ...], logger: logging.Logger, *,
                 interval_s: float = 10.0, notes: dict[str, str] | None = None,
                 started_at: float | None = None) -> None:
        self.title = title
        self.round_name = round_name
        self.stages = stages
        self.notes = notes or {}           # stage -> a stage shown in brackets after it (a part of it)
        self.logger = logger
        self.interval_s = interval_s
        self.totals = dict.fromkeys(stages, 0.0)
        self.rounds = 0
        self.lines: list[str] = []         # the last few reports (kept for tests and benchmarks)
        # time.perf_counter() of the interval's start (tests pass their own clock)
        self._interval_start = time.perf_counter() if started_at is None else started_at

    def add(self, stage: str, seconds: float) -> None:
        self.totals[stage] += seconds

    def end_round(self, now: float | None = None) -> None:
        """One more round; logs and resets the sums once the interval is over."""
        self.rounds += 1
        now = time.perf_counter() if now is None else now
        if now - self._interval_start >= self.interval_s:
            self.report(now)

    def per_round_ms(self) -> dict[str, float]:
        """Mean milliseconds per round of each stage in the current interval (zeros without rounds)."""
        rounds = max(self.rounds, 1)
        return {stage: total * 1e3 / rounds for stage, total in self.totals.items()}

    def report(self, now: float | None = None) -> str:
        """The summary line of the interval so far (logged at DEBUG); starts a new interval."""
        now = time.perf_counter() if now is None else now
        per_round = self.per_round_ms()
        shown = []
        for stage in self.stages:
            if stage in self.notes.values():
                continue                   # shown in brackets after the stage it is part of
            text = f"{stage} {per_round[stage]:.3f}"
            part = self.notes.get(stage)
            if part is not None:
                text += f" ({part} {per_round[part]:.3f})"
            shown.append(text)
        line = (f"{self.title}: {self.rounds} {self.round_name}s in {now - self._interval_start:.1f} s, "
                f"ms per {self.round_name}: {', '.join(shown)}")
        self.logger.debug("%s", line)
        self.lines = [*self.lines[-7:], line]
        self.totals = dict.fromkeys(self.stages, 0.0)
        self.rounds = 0
        self._interval_start = now
        return line
