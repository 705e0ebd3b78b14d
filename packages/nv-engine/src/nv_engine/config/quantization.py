"""Which weight quantization a model runs with: `quantization` (EngineArgs / --quantization) against the
checkpoint's config.json `quantization_config`.

Supported:
- block-wise FP8 ("fp8": e4m3 weights, one float32 scale per 128 x 128 block, activations quantized dynamically per
  token per 128-channel group), read from a Qwen3-FP8 / DeepSeek-V3 style checkpoint or made at load from a bf16 /
  fp16 / fp32 checkpoint (online quantization);
- INT4 weights with 16-bit activations (W4A16, groups of 128 inputs) read from AWQ ("awq") and GPTQ ("gptq")
  checkpoints (nv_layers.int4_checkpoint names the variants); "awq" on an unquantized checkpoint quantizes it at load
  by round to nearest in AWQ's asymmetric grid (no activation-aware scaling: there is no calibration data). GPTQ
  needs calibration, so "gptq" takes a GPTQ checkpoint only.
None follows the checkpoint.
"""
from __future__ import annotations

from typing import Any

from nv_layers.int4_checkpoint import INT4_METHODS, SUPPORTED, Int4CheckpointFormat, quantization_config_dict

QUANTIZATION_CHOICES = ("fp8", "awq", "gptq")
ONLINE = ("fp8", "awq")              # what an unquantized checkpoint can be quantized to when it loads
_FP8_CHECKPOINT = {"fmt": ("e4m3",), "activation_scheme": ("dynamic",), "weight_block_size": ([128, 128],)}
_FP8_SUPPORTED = ("block-wise FP8 (quant_method 'fp8', fmt 'e4m3', weight_block_size [128, 128], activation_scheme "
                  "'dynamic')")


def _checkpoint_method(hf_config: Any) -> str | None:
    """The checkpoint's quantization ("fp8", "awq", "gptq"), None for an unquantized one; ValueError for what nv
    cannot run."""
    qc = quantization_config_dict(hf_config)
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method in INT4_METHODS:
        return Int4CheckpointFormat.from_quantization_config(qc).method
    if method != "fp8":
        raise ValueError(f"the checkpoint's quantization_config has quant_method={method!r}; nv runs "
                         f"{_FP8_SUPPORTED} and INT4 {SUPPORTED} checkpoints, or unquantized ones")
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
    (online: "fp8" or "awq"); ValueError for an unknown value or one that contradicts the checkpoint."""
    if requested is not None and requested not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization={requested!r} is not supported: nv runs {', '.join(QUANTIZATION_CHOICES)} "
                         "(block-wise FP8 weights; INT4 AWQ / GPTQ weights) or None (as the checkpoint is)")
    found = _checkpoint_method(hf_config)
    if found is not None and requested is not None and requested != found:
        raise ValueError(f"quantization={requested!r} does not match the checkpoint, which is {found!r}; leave "
                         "quantization None to follow the checkpoint")
    if found is None and requested is not None and requested not in ONLINE:
        raise ValueError(f"quantization={requested!r} needs a {requested.upper()} checkpoint: GPTQ quantizes with "
                         "calibration data, which nv does not do at load; quantization='awq' quantizes an "
                         "unquantized checkpoint when it loads (round to nearest, INT4)")
    return found or requested
