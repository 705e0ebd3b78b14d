"""Architecture name (config.json `architectures[0]`) -> model class.

A built-in table (needed where the packages run from source on PYTHONPATH, without installed metadata)
plus the entry-point group `nv_engine.models`, whose entries are named by architecture and load the
class, for third-party model packages."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "nv_engine.models"

# architecture -> "module:ClassName", imported lazily so a missing optional package fails only when used.
_BUILTIN: dict[str, str] = {
    "Qwen3ForCausalLM": "nv_qwen3:Qwen3ForCausalLM",
    "Qwen2ForCausalLM": "nv_qwen3:Qwen2ForCausalLM",
    "LlamaForCausalLM": "nv_llama:LlamaForCausalLM",
}
_REGISTERED: dict[str, Any] = {}


def register_model(architecture: str, model_class: type | str) -> None:
    """Add (or replace) an architecture at run time; `model_class` is a class or "module:Class"."""
    _REGISTERED[architecture] = model_class


def builtin_model_modules() -> list[str]:
    """The modules of the built-in table's model classes (what a process may import ahead of building a model)."""
    return sorted({target.partition(":")[0] for target in _BUILTIN.values()})


def builtin_hf_config_modules() -> list[str]:
    """The transformers modules of the built-in architectures' config classes (`Qwen3ForCausalLM` ->
    transformers.models.qwen3.configuration_qwen3), which unpickling such a model's config imports."""
    types = sorted({arch.removesuffix("ForCausalLM").lower() for arch in _BUILTIN})
    return [f"transformers.models.{name}.configuration_{name}" for name in types]


def _entry_point_table() -> dict[str, Any]:
    try:
        return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # broken metadata must not break the built-in models
        return {}


def supported_architectures() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED) | set(_entry_point_table()))


def _load(target: Any) -> type:
    if isinstance(target, type):
        return target
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(module_name), attr)
    return target.load()  # an EntryPoint


def get_model_class(hf_config: Any) -> type:
    """The class for `hf_config.architectures[0]`; ValueError naming it and the supported ones."""
    architectures = getattr(hf_config, "architectures", None) or []
    if not architectures:
        raise ValueError("the model's config.json names no architecture (`architectures` is empty); "
                         f"supported: {', '.join(supported_architectures())}")
    name = architectures[0]
    target = _REGISTERED.get(name) or _BUILTIN.get(name) or _entry_point_table().get(name)
    if target is None:
        raise ValueError(f"unsupported model architecture {name!r}; "
                         f"supported: {', '.join(supported_architectures())}")
    return _load(target)
