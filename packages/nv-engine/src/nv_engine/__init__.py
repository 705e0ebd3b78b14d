"""The nv inference engine: LLM.generate, LLMEngine, model runner, tensor-parallel workers, the nv CLI and server."""
from nv_engine.__about__ import __version__
from nv_engine.async_llm import AsyncLLM
from nv_engine.config import EngineConfig
from nv_engine.engine_args import EngineArgs
from nv_engine.llm import LLM
from nv_engine.llm_engine import LLMEngine
from nv_engine.outputs import CompletionOutput, Logprob, RequestOutput
from nv_engine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "AsyncLLM", "CompletionOutput", "EngineArgs", "EngineConfig", "LLMEngine", "Logprob", "RequestOutput",
           "SamplingParams", "StructuredOutputsParams", "__version__"]
