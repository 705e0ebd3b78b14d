"""Thin wrapper over the flash-attn 2 package (a build of its own: no PyPI wheels), used when importable on CUDA."""
from __future__ import annotations

import torch
from flash_attn import (  # pyright: ignore[reportMissingImports] - optional, CUDA only
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from torch import Tensor

from nv_kernels.interface import check_query, check_store
from nv_kernels.kv_quant import is_fp8
from nv_kernels.triton_store import store_kvcache as triton_store_kvcache


def _refuse_fp8(k_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None) -> None:
    if is_fp8(k_cache.dtype) or k_scale is not None or v_scale is not None:
        raise ValueError("the flash_attn backend cannot read nv's FP8 KV cache; use the triton backend")


class FlashAttnBackend:
    """flash_attn_varlen_func (prefill over a paged cache) and flash_attn_with_kvcache (decode)."""

    name = "flash_attn"

    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        _refuse_fp8(k_cache, k_scale, v_scale)
        check_store(key, value, k_cache, v_cache, slot_mapping)
        triton_store_kvcache(key, value, k_cache, v_cache, slot_mapping)

    def prefill(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cu_seqlens_q: Tensor,
                seq_lens: Tensor, block_tables: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                scale: float, k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
        _refuse_fp8(k_cache, k_scale, v_scale)
        check_query(q, k_cache, v_cache)
        cu_seqlens_k = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=q.device)
        cu_seqlens_k[1:] = seq_lens.cumsum(0)
        return flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q,
                                      cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                      max_seqlen_k=max_seqlen_k, softmax_scale=scale, causal=True,
                                      block_table=block_tables)

    def decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor,
               block_tables: Tensor, max_seqlen_k: int, scale: float, k_scale: Tensor | None = None,
               v_scale: Tensor | None = None) -> Tensor:
        _refuse_fp8(k_cache, k_scale, v_scale)
        check_query(q, k_cache, v_cache)
        out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=seq_lens,
                                      block_table=block_tables, softmax_scale=scale, causal=True)
        return out.squeeze(1)  # [B, Hq, D]
