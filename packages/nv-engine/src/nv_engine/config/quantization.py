"""Which weight quantization a model runs with: `quantization` (EngineArgs / --quantization) against the
checkpoint's config.json `quantization_config`.

Supported: block-wise FP8 ("fp8": e4m3 weights, one float32 scale per 128 x 128 block, activations quantized
dynamically per token per 128-channel group), read from a Qwen3-FP8 / DeepSeek-V3 style checkpoint or made at load
from a bf16 / fp16 / fp32 checkpoint (online quantization). None follows the checkpoint.
"""
from __future__ import annotations

from typing import Any

QUANTIZATION_CHOICES = ("fp8",)
_FP8_CHECKPOINT = {"fmt": ("e4m3",), "activation_scheme": ("dynamic",), "weight_block_size": ([128, 128],)}


def _checkpoint_method(hf_config: Any) -> str | None:
    """The checkpoint's quantization ("fp8"), None for an unquantized one; ValueError for what nv cannot run."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    method = qc.get("quant_method")
    if method != "fp8":
        raise ValueError(f"the checkpoint's quantization_config has quant_method={method!r}; nv runs block-wise FP8 "
                         "checkpoints only (quant_method 'fp8', fmt 'e4m3', weight_block_size [128, 128], "
                         "activation_scheme 'dynamic'), or unquantized ones")
    for key, allowed in _FP8_CHECKPOINT.items():
        value = qc.get(key, allowed[0])
        if isinstance(value, tuple):
            value = list(value)
        if value not in allowed:
            raise ValueError(f"the checkpoint's FP8 quantization_config has {key}={value!r}; nv supports "
                             f"{key}={allowed[0]!r} only")
    return "fp8"


def resolve_quantization(requested: str | None, hf_config: Any) -> str | None:
    """The quantization the model runs with: the checkpoint's, or `requested` for an unquantized checkpoint
    (online); ValueError for an unknown value or one that contradicts the checkpoint."""
    if requested is not None and requested not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization={requested!r} is not supported: nv runs {', '.join(QUANTIZATION_CHOICES)} "
                         "(block-wise FP8 weights) or None (as the checkpoint is)")
    found = _checkpoint_method(hf_config)
    if found is not None and requested is not None and requested != found:
        raise ValueError(f"quantization={requested!r} does not match the checkpoint, which is {found!r}; leave "
                         "quantization None to follow the checkpoint")
    return found or requested
