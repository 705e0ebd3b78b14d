"""How a layer's K and V caches lie in memory.

Every kernel and the torch reference see both caches as [NB, BS, Hkv, D] tensors and index them
through their strides. K is always contiguous (a token's head_dim channels side by side). V is
contiguous too, except in an FP8 cache: there it is token-major, [NB, Hkv, D, BS] in memory (a page
holds each (head, channel)'s BS tokens side by side) and seen through a permuted view.

Why: attention multiplies probabilities [rows, tokens] by V [tokens, D], so the tensor-core operand
wants consecutive tokens of one channel together. A 16-bit cache gets them with a transposing shared
memory load (ldmatrix.trans); Hopper has no such load for 8-bit elements, so an FP8 V tile in the
usual layout is read from shared memory one byte at a time. Token-major V pages give the dot its
operand with the same 16-byte copies K uses.
"""
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels.kv_quant import is_fp8


def v_is_token_major(dtype: torch.dtype) -> bool:
    """Whether a V cache of this dtype is allocated token-major (FP8 caches)."""
    return is_fp8(dtype)


def allocate_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, Tensor, Tensor]:
    """Zeroed caches of one layer: (storage [2, NB*BS*Hkv*D], k_cache, v_cache), both caches
    [NB, BS, Hkv, D] views of the storage (V token-major for FP8)."""
    per_cache = num_blocks * block_size * num_kv_heads * head_dim
    storage = torch.zeros(2, per_cache, dtype=dtype, device=device)
    k_cache = storage[0].view(num_blocks, block_size, num_kv_heads, head_dim)
    if v_is_token_major(dtype) and block_size > 1:   # one token per page: the two layouts are the same
        v_cache = storage[1].view(num_blocks, num_kv_heads, head_dim, block_size).permute(0, 3, 1, 2)
    else:
        v_cache = storage[1].view(num_blocks, block_size, num_kv_heads, head_dim)
    return storage, k_cache, v_cache


def to_token_major(v_cache: Tensor) -> Tensor:
    """A [NB, BS, Hkv, D] cache -> the same values in a token-major copy (tests and benchmarks)."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def v_strides_token_major(v_cache: Tensor) -> bool:
    """True when a [NB, BS, Hkv, D] view stores each (head, channel)'s tokens contiguously (never for one
    token per page, where it is the usual layout)."""
    _, block_size, _, head_dim = v_cache.shape
    return (block_size > 1 and v_cache.stride(1) == 1 and v_cache.stride(3) == block_size
            and v_cache.stride(2) == head_dim * block_size)


def check_cache_layout(k_cache: Tensor, v_cache: Tensor) -> None:
    """ValueError unless k_cache is [NB, BS, Hkv, D] with a contiguous head_dim and v_cache has K's
    strides or the token-major ones."""
    if not cache_layout_supported(k_cache, v_cache):
        raise ValueError("k_cache needs a contiguous head_dim, and v_cache k_cache's strides or the "
                         "token-major layout of nv_kernels.kv_layout")


def cache_layout_supported(k_cache: Tensor, v_cache: Tensor) -> bool:
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.stride(-1) != 1:
        return False
    return v_cache.stride() == k_cache.stride() or v_strides_token_major(v_cache)
