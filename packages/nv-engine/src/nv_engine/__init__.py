"""The nv inference engine: LLM.generate, LLMEngine, model runner, tensor-parallel workers, the nv CLI and server."""
from nv_engine.__about__ import __version__

__all__ = ["__version__"]
