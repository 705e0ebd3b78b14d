"""The attention backend interface shared by every backend, plus input checks they all use."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from nv_kernels.decode_rope import DecodeRope


@runtime_checkable
class AttentionBackend(Protocol):
    """Paged-KV attention ops. Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim].

    GQA: query head h uses KV head h // (Hq // Hkv).
    """

    name: str

    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        """key/value [T, Hkv, D] -> cache slot slot_mapping[t] = block_id * BS + offset; slot < 0 skips.

        An FP8 cache (nv_kernels.kv_quant) stores clamp(x / scale) and needs k_scale / v_scale (float32, [1] or
        per (KV head, channel) [Hkv, D]);
        the attention methods then read K as fp8 * k_scale and V as fp8 * v_scale."""
        ...

    def prefill(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        *,
        cu_seqlens_q: Tensor,
        seq_lens: Tensor,
        block_tables: Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """q [T, Hq, D] -> [T, Hq, D]; sequence b's queries sit at the end of its seq_lens[b] context."""
        ...

    def decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        *,
        seq_lens: Tensor,
        block_tables: Tensor,
        max_seqlen_k: int,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """q [B, Hq, D] -> [B, Hq, D]; one query per sequence at position seq_lens[b] - 1."""
        ...


@runtime_checkable
class DecodesWithRope(Protocol):
    """A backend whose decode finishes q and k itself (nv_kernels.decode_rope): q holds the raw query heads,
    and the new tokens' k / v (rope.k, rope.v, raw) are normed, rotated and stored by the decode kernel."""

    def decode_rope_pays(self, batch: int, num_kv_heads: int, max_seqlen_k: int, device: torch.device,
                         fp8: bool = False) -> bool:
        """Whether decode_with_rope is faster for this decode shape (fp8: on an FP8 cache) than the separate norm +
        rotary + store kernel followed by decode (static facts only: a CUDA graph captured with the answer stays
        valid)."""
        ...

    def decode_with_rope(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor, block_tables: Tensor,
        max_seqlen_k: int, scale: float, rope: DecodeRope, k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """As decode, with q [B, Hq, D] raw (strided along B and H allowed) -> [B, Hq, D]."""
        ...


@runtime_checkable
class DecodesQueries(Protocol):
    """A backend with a decode attention for Q query tokens per sequence (speculative decoding's verify steps, in
    the decode CUDA graphs): the query rows of one sequence are the last Q positions of its context."""

    def decode_queries(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor, block_tables: Tensor,
        max_seqlen_k: int, scale: float, query_len: int, k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """q [B * Q, Hq, D] (Q = query_len; sequence b's rows b * Q .. b * Q + Q - 1) -> [B * Q, Hq, D]. Query token j
        of sequence b attends to positions < seq_lens[b] - Q + 1 + j; rows whose limit is <= 0 come out as 0."""
        ...


@runtime_checkable
class WarmsUp(Protocol):
    """A backend whose kernels compile on first use and that can compile them ahead of the first request."""

    def warm_up(self, num_q_heads: int, k_cache: Tensor, v_cache: Tensor) -> None:
        """Compile the prefill and decode variants used with this cache (dtype, head_dim, block size) and
        num_q_heads query heads. Reads the cache, writes nothing to it."""
        ...


def check_cache(k_cache: Tensor, v_cache: Tensor) -> tuple[int, int, int, int]:
    """Validate a K/V cache pair; return (num_blocks, block_size, num_kv_heads, head_dim)."""
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [num_blocks, block_size, Hkv, D], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    nb, bs, hkv, d = k_cache.shape
    return nb, bs, hkv, d


def check_query(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[int, int]:
    """Validate q [N, Hq, D] against the cache; return (Hq, Hkv)."""
    _, _, hkv, d = check_cache(k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, Hq, D], got shape {tuple(q.shape)}")
    hq = q.shape[1]
    if q.shape[2] != d:
        raise ValueError(f"q head_dim {q.shape[2]} != cache head_dim {d}")
    if hq % hkv != 0:
        raise ValueError(f"query heads {hq} must be a multiple of KV heads {hkv}")
    return hq, hkv


def check_store(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Validate store_kvcache inputs."""
    _, _, hkv, d = check_cache(k_cache, v_cache)
    if key.dim() != 3 or key.shape[1:] != (hkv, d):
        raise ValueError(f"key must be [T, {hkv}, {d}], got shape {tuple(key.shape)}")
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping must be [{key.shape[0]}], got shape {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
