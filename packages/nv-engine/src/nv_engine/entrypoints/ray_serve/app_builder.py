"""`build_app(args)`: nv's Ray Serve application, for `serve run` and `serve deploy` configs
(`import_path: nv_engine.entrypoints.ray_serve:build_app`) and for `serve.run(build_app({...}))`."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from nv_engine.entrypoints.ray_serve.app_args import RayAppArgs
from nv_engine.entrypoints.ray_serve.replica import NVReplica
from nv_engine.entrypoints.ray_serve.replica_header import ReplicaHeader
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_async_llm, engine_kwargs

DEPLOYMENT_NAME = "NVServer"   # the name a config's `deployments:` entry overrides options by


def build_app(args: dict[str, Any]) -> Application:
    """One deployment (DEPLOYMENT_NAME) whose replicas each serve nv's OpenAI routes over their own
    engine. `args`: `nv serve`'s flags by name plus the deployment's options (see RayAppArgs); a bad
    arg raises ValueError here, before any replica starts."""
    app_args = RayAppArgs.from_builder_args(args)
    server_args = app_args.server_args

    def build_replica_app() -> FastAPI:
        """Runs on each replica, after NVReplica's constructor (Ray's ingress builder)."""
        engine = create_async_llm(server_args.model, **engine_kwargs(server_args))
        try:
            app = build_app_for_engine(engine, server_args)
            app.add_middleware(ReplicaHeader, replica_id=serve.get_replica_context().replica_id.unique_id)
        except BaseException:
            engine.shutdown()
            raise
        return app

    deployment = serve.deployment(serve.ingress(build_replica_app)(NVReplica), name=DEPLOYMENT_NAME)
    return deployment.options(**app_args.deployment_options).bind()
