"""Architecture name -> model class for the models this package provides."""
from __future__ import annotations

from typing import Any

from torch import nn

from nv_qwen3.model import Qwen2ForCausalLM, Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


def get_model_class(config: Any) -> type[nn.Module]:
    """The class for config.architectures[0]; ValueError naming it when this package lacks it."""
    archs = getattr(config, "architectures", None) or []
    if not archs:
        raise ValueError("model config has no 'architectures' entry; cannot pick a model class")
    cls = MODEL_CLASSES.get(archs[0])
    if cls is None:
        raise ValueError(f"architecture {archs[0]!r} is not supported by nv_qwen3; supported: "
                         f"{', '.join(sorted(MODEL_CLASSES))}")
    return cls
