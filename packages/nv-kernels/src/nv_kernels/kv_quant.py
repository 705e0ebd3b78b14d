"""FP8 KV cache: the cache dtypes, and the reference quantize / dequantize every backend agrees with.

A cache element is stored as clamp(x / scale, -max, max) rounded to the FP8 dtype (round to nearest
even) and read back as fp8 * scale. One float32 scale per layer for K and one for V ([1] tensors on
the cache's device, so kernels read them without a host sync: CUDA-graph safe). The scales are fixed
before the first request: a cached block must read back the same values for every later request.
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
    """An FP8 cache needs both scales: float32 [1] tensors on the cache's device."""
    if not is_fp8(cache.dtype):
        return
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise ValueError(f"an FP8 KV cache ({cache.dtype}) needs {name}")
        if scale.dtype != torch.float32 or scale.numel() != 1 or scale.device != cache.device:
            raise ValueError(f"{name} must be a float32 tensor of one element on {cache.device}, got "
                             f"{scale.dtype} {tuple(scale.shape)} on {scale.device}")


def quantize(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """x (any float dtype) -> dtype (FP8): clamp(x / scale) rounded; x unchanged in shape."""
    limit = fp8_max(dtype)
    return (x.float() / scale.float()).clamp_(-limit, limit).to(dtype)


def dequantize(x: Tensor, scale: Tensor) -> Tensor:
    """FP8 x -> float32 x * scale."""
    return x.float() * scale.float()
