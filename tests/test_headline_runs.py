"""benchmarks/headline_runs.py --step-times: every engine step of both timed runs, and where the cold one pays more."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def headline_runs():
    return load_script("benchmarks/headline_runs.py")


def test_step_times_wrap_the_engine_and_report_the_cold_excess(headline_runs, monkeypatch) -> None:
    clock = iter(range(1000))
    monkeypatch.setattr(headline_runs.time, "perf_counter", lambda: next(clock) * 0.001)
    durations = iter([5, 1, 1, 30, 1, 1, 1, 1])          # ticks per step: run 1 then run 2 (four steps each)
    calls = []

    def step():
        for _ in range(next(durations) - 1):               # each tick of the clock is one ms
            headline_runs.time.perf_counter()
        calls.append(1)
        return []

    llm = SimpleNamespace(llm_engine=SimpleNamespace(step=step))
    timer = headline_runs.StepTimes(llm)
    llm.llm_engine.step()                                  # outside a timed run: not recorded
    durations = iter([5, 1, 1, 30, 1, 1, 1, 1])
    for _ in range(2):
        timer.start_run()
        for _ in range(4):
            llm.llm_engine.step()
    report = timer.cold_excess(top=2, first=2)
    assert len(calls) == 9 and report["steps"] == [4, 4]
    assert report["excess_ms"] == pytest.approx(4 + 29)
    assert report["largest"] == [[3, 30.0, 1.0], [0, 5.0, 1.0]]
    assert report["first_ms"] == [[5.0, 1.0], [1.0, 1.0]]


def test_window_sums_split_a_run_into_consecutive_windows(headline_runs) -> None:
    run = [0.001] * 250 + [0.010] * 3                      # 253 steps: 1 ms each, then three of 10 ms
    assert headline_runs.StepTimes.window_sums(run) == [100.0, 100.0, 80.0]
    assert headline_runs.StepTimes.window_sums(run, window=250) == [250.0, 30.0]
