"""The nv inference engine: LLM.generate, LLMEngine, model runner, tensor-parallel workers, the nv CLI and server.

The public names load on first use (PEP 562), so `import nv_engine.<module>` does not import torch unless that
module does: the `nv` command starts its engine-core forkserver before it imports torch (core_forkserver.py)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nv_engine.__about__ import __version__

if TYPE_CHECKING:
    from nv_engine.async_llm import AsyncLLM
    from nv_engine.config import EngineConfig
    from nv_engine.engine_args import EngineArgs
    from nv_engine.llm import LLM
    from nv_engine.llm_engine import LLMEngine
    from nv_engine.outputs import CompletionOutput, Logprob, RequestOutput
    from nv_engine.sampling_params import SamplingParams, StructuredOutputsParams

_MODULES = {
    "AsyncLLM": "nv_engine.async_llm", "EngineConfig": "nv_engine.config", "EngineArgs": "nv_engine.engine_args",
    "LLM": "nv_engine.llm", "LLMEngine": "nv_engine.llm_engine", "CompletionOutput": "nv_engine.outputs",
    "Logprob": "nv_engine.outputs", "RequestOutput": "nv_engine.outputs", "SamplingParams": "nv_engine.sampling_params",
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
