"""EngineDeadError: the engine-core process is gone; every open request fails with it."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine core died (or was shut down); a new AsyncLLM is needed to serve again."""
