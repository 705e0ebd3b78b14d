"""The nv inference engine: LLM.generate, LLMEngine, AsyncLLM, the model runner, tensor-parallel workers, the
`nv` command and the OpenAI-compatible server.

Where things are (vLLM v1's layout):
    config/             EngineArgs (every user-facing engine argument) -> EngineConfig (resolved, frozen)
    engine/             the frontend: LLMEngine, AsyncLLM, output processing and detokenization, core clients
    core/               the engine core: scheduler + executor, one step; its process; the step contract
    executor/           where model runners live: in process, worker processes, torchrun
    runner/             what runs on every rank: ModelRunner, input staging, CUDA graphs, memory sizing
    model_loader/       model paths, the architecture registry, random-weight checkpoints, GGUF
    structured_output/  JSON schema / regex / grammar constraints with xgrammar
    spec_decode/        speculative decoding's host side: ngram and draft-model proposers
    metrics/            Prometheus metrics and the periodic stats line
    entrypoints/        LLM (offline API), the `nv` CLI, bench/, server/ (`nv serve`), ray_serve/
    sampling_params.py  SamplingParams
    envs.py             every NV_* environment variable, read when asked for

The public names load on first use (PEP 562), so `import nv_engine.<module>` does not import torch unless that
module does: the `nv` command starts its engine-core forkserver before it imports torch
(engine/core_forkserver.py)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nv_engine.__about__ import __version__

if TYPE_CHECKING:
    from nv_engine.config.engine_args import EngineArgs
    from nv_engine.config.engine_config import EngineConfig
    from nv_engine.engine.async_llm import AsyncLLM
    from nv_engine.engine.llm_engine import LLMEngine
    from nv_engine.engine.outputs import CompletionOutput, Logprob, RequestOutput
    from nv_engine.entrypoints.llm import LLM
    from nv_engine.sampling_params import SamplingParams, StructuredOutputsParams

_MODULES = {
    "AsyncLLM": "nv_engine.engine.async_llm",
    "EngineConfig": "nv_engine.config.engine_config",
    "EngineArgs": "nv_engine.config.engine_args",
    "LLM": "nv_engine.entrypoints.llm",
    "LLMEngine": "nv_engine.engine.llm_engine",
    "CompletionOutput": "nv_engine.engine.outputs",
    "Logprob": "nv_engine.engine.outputs",
    "RequestOutput": "nv_engine.engine.outputs",
    "SamplingParams": "nv_engine.sampling_params",
    "StructuredOutputsParams": "nv_engine.sampling_params",
}

__all__ = ["LLM", "AsyncLLM", "CompletionOutput", "EngineArgs", "EngineConfig", "LLMEngine", "Logprob", "RequestOutput",
           "SamplingParams", "StructuredOutputsParams", "__version__"]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'nv_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
