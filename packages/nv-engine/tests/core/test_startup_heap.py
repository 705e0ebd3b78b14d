"""freeze_startup_heap: what is alive at start-up leaves the collector's generations; what comes later does not."""
from __future__ import annotations

import gc

from nv_engine.core.startup_heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self          # a reference cycle: only the cyclic collector frees it


def test_start_up_objects_are_frozen_and_later_garbage_is_still_collected():
    kept = [_Node() for _ in range(100)]
    try:
        frozen = freeze_startup_heap("test")
        assert frozen == gc.get_freeze_count() and frozen >= len(kept)
        tracked = {id(obj) for obj in gc.get_objects()}     # every generation's objects: none of the frozen
        assert not any(id(node) in tracked for node in kept)
        for _ in range(100):
            _Node()             # garbage made after start-up, in cycles
        assert gc.collect() >= 100
    finally:
        gc.unfreeze()
