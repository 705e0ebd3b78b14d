"""FP8 KV cache: the cache dtypes, and the reference quantize / dequantize every backend agrees with.

A cache element is stored as clamp(x / scale, -max, max) rounded to the FP8 dtype (round to nearest
even) and read back as fp8 * scale. Each layer has a float32 scale for K and one for V: either one
number ([1], per tensor) or one per (KV head, channel) ([Hkv, D]), which broadcasts over the tokens of
a [T, Hkv, D] tensor. The tensors live on the cache's device, so kernels read them without a host sync
(CUDA-graph safe). The scales are fixed before the first request: a cached block must read back the
same values for every later request.

Per-channel scales cost nothing inside attention: score = sum_c q[c] * k_scale[h, c] * Kq[c], so the
kernels multiply q by k_scale once per query instead of K per element, and out[c] = v_scale[h, c] *
sum_t p_t * Vq_t[c] multiplies the output once.
"""
from __future__ import annotations

import torch
from torch import Tensor

# kv_cache_dtype names (vLLM's) -> torch dtype; "fp8" is e4m3 (more mantissa, range +-448).
FP8_KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def check_scales(cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None) -> None:
    """An FP8 cache [NB, BS, Hkv, D] needs both scales: float32 tensors on the cache's device, of one
    element or of shape [Hkv, D]."""
    if not is_fp8(cache.dtype):
        return
    per_channel = tuple(cache.shape[2:])
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise ValueError(f"an FP8 KV cache ({cache.dtype}) needs {name}")
        if (scale.dtype != torch.float32 or scale.device != cache.device
                or (scale.numel() != 1 and tuple(scale.shape) != per_channel)):
            raise ValueError(f"{name} must be a float32 tensor of one element or of shape {per_channel} on "
                             f"{cache.device}, got {scale.dtype} {tuple(scale.shape)} on {scale.device}")


def scale_strides(scale: Tensor) -> tuple[int, int]:
    """Element strides (per KV head, per channel) of a checked scale, for kernels that read scale[h, c]
    at h * stride_h + c * stride_c: (0, 0) for one number, so a per-tensor scale needs no expanded copy."""
    if scale.numel() == 1:
        return 0, 0
    return scale.stride(0), scale.stride(1)


def quantize(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """x (any float dtype) -> dtype (FP8): clamp(x / scale) rounded; x unchanged in shape."""
    limit = fp8_max(dtype)
    return (x.float() / scale.float()).clamp_(-limit, limit).to(dtype)


def dequantize(x: Tensor, scale: Tensor) -> Tensor:
    """FP8 x -> float32 x * scale."""
    return x.float() * scale.float()
