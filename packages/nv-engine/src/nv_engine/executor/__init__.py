"""Executors: run ModelRunner methods on every tensor-parallel rank (see base.py for the choice)."""
from nv_engine.executor.base import Executor
from nv_engine.executor.multiproc import MultiProcExecutor
from nv_engine.executor.torchrun import TorchrunExecutor
from nv_engine.executor.uniproc import UniProcExecutor

__all__ = ["Executor", "MultiProcExecutor", "TorchrunExecutor", "UniProcExecutor"]
