"""nv on Ray Serve (needs the extra `nv-engine[ray]`): replicas of `nv serve`'s OpenAI app behind Ray's
HTTP proxy, each with its own engine on its own GPUs; Ray places, scales, health-checks and replaces them.

    serve run nv_engine.entrypoints.ray_serve:build_app model=Qwen/Qwen3-0.6B num_replicas=2
    serve run config.yaml      # import_path: nv_engine.entrypoints.ray_serve:build_app, args: {...}

Module map: app_args (the builder's args: `nv serve` flags plus deployment options), replica (the
deployment's class: health check), replica_header (the `x-nv-replica` response header), app_builder
(`build_app`).
"""
from nv_engine.entrypoints.ray_serve.app_builder import DEPLOYMENT_NAME, build_app

__all__ = ["DEPLOYMENT_NAME", "build_app"]
