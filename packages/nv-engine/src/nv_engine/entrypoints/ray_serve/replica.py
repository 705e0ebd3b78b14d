"""NVReplica: the class of nv's Ray Serve deployment (one object per replica)."""
from __future__ import annotations

from fastapi import FastAPI


class NVReplica:
    """One replica of nv on Ray Serve. `build_app` wraps it with `serve.ingress(builder)`: Ray builds
    nv's OpenAI app on the replica after this constructor (an AsyncLLM whose engine core, and its
    tensor-parallel workers, run as child processes of the replica on the replica's GPUs) and serves it
    behind Ray's HTTP proxy. The app's lifespan shuts the engine down when Ray stops the replica.

    Ray Serve calls `check_health` every `health_check_period_s`: once the engine core has died the
    replica reports unhealthy, and Ray replaces it (its open requests have ended with a 503 error)."""

    # nv's FastAPI app; Ray's ingress wrapper provides it as the property `app`
    # (a bare annotation, so the wrapper's property is what the attribute lookup finds).
    app: FastAPI

    def check_health(self) -> None:
        engine = self.app.state.nv.engine
        if not engine.is_alive:
            raise RuntimeError("the engine core of this replica is not running")
