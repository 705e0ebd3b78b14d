"""Where a model's files are: a local directory, or a hub id fetched with huggingface_hub."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nv_engine import envs

# Files the engine needs from a hub snapshot (weights, config, tokenizer, chat template).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def _hub_offline() -> bool:
    return envs.hf_hub_offline()


def resolve_model_path(model: str | os.PathLike, *, revision: str | None = None, cache_dir: str | None = None,
                       token: str | bool | None = None) -> str:
    """A local directory as an absolute path; a .gguf file (or a directory holding one) as its cached
    HF-format conversion (nv_engine.model_loader.gguf); otherwise a hub id downloaded (or found in the HF cache)
    with huggingface_hub (at `revision`, into `cache_dir`, with `token`: only used for hub ids).
    ValueError with the reason when neither works."""
    if not isinstance(model, (str, os.PathLike)) or not str(model):
        raise ValueError(f"model must be a local directory or a hub id, got {model!r}")
    path = Path(model).expanduser()
    from nv_engine.model_loader.gguf import convert_gguf, find_gguf_file

    gguf_file = find_gguf_file(path) if path.exists() else None
    if gguf_file is not None:  # a .gguf file, or a directory holding one: convert once, cached
        return str(convert_gguf(gguf_file))
    if path.is_dir():
        return str(path.resolve())
    if path.exists():
        raise ValueError(f"model {str(model)!r} is a file, not a model directory")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ValueError(f"model {str(model)!r} is not a local directory and huggingface_hub is "
                         "not installed to fetch it") from exc
    try:
        return snapshot_download(repo_id=str(model), allow_patterns=_HUB_PATTERNS, revision=revision,
                                 cache_dir=cache_dir, token=token, local_files_only=_hub_offline())
    except Exception as exc:  # offline, unknown repo, bad id, auth: all the user's to fix
        raise ValueError(f"model {str(model)!r} is not a local directory and could not be fetched "
                         f"from the Hugging Face hub ({type(exc).__name__}: {exc})") from exc


def refuse_remote_code(path: str) -> None:
    """ValueError when the checkpoint's config.json asks for code shipped with the checkpoint
    (`auto_map`) or names a model_type transformers does not know: nv never runs checkpoint code."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{config_file} does not hold a JSON object")
    if raw.get("auto_map"):
        raise ValueError(f"{config_file} asks for custom code (auto_map); nv does not run code from "
                         f"checkpoints (trust_remote_code is never enabled)")
    from transformers import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if model_type is not None and model_type not in CONFIG_MAPPING:
        raise ValueError(f"{config_file} has model_type {model_type!r}, which transformers does not "
                         f"know; nv does not run code from checkpoints (trust_remote_code is never enabled)")


def load_hf_config(path: str) -> Any:
    """The transformers config of a resolved model path; ValueError when it cannot be read or
    needs code from the checkpoint."""
    from transformers import AutoConfig

    refuse_remote_code(path)
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"cannot read a model config from {path!r}: {exc}") from exc
