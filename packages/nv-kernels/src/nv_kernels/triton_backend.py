"""The Triton backend (GPU default). On CPU it runs only under TRITON_INTERPRET=1 (tests)."""
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels import envs
from nv_kernels.decode_rope import DecodeRope
from nv_kernels.decode_tuning import fused_decode_rope_pays
from nv_kernels.interface import check_query, check_store
from nv_kernels.kv_layout import check_cache_layout
from nv_kernels.kv_quant import check_scales
from nv_kernels.triton_decode import decode_attention
from nv_kernels.triton_prefill import prefill_attention
from nv_kernels.triton_store import store_kvcache
from nv_kernels.triton_verify import verify_attention


def _check_device(*tensors: Tensor) -> None:
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {t.device}")
    if device.type != "cuda" and not envs.triton_interpret():
        raise ValueError(f"the triton backend needs CUDA tensors (got {device}); "
                         "set TRITON_INTERPRET=1 to interpret on CPU")


def _last_dim_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class TritonBackend:
    """store_kvcache, split-KV paged decode and varlen paged prefill written in Triton."""

    name = "triton"

    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        check_store(key, value, k_cache, v_cache, slot_mapping)
        check_scales(k_cache, k_scale, v_scale)
        _check_device(key, value, k_cache, v_cache, slot_mapping)
        check_cache_layout(k_cache, v_cache)
        store_kvcache(_last_dim_contiguous(key), _last_dim_contiguous(value), k_cache, v_cache,
                      slot_mapping.contiguous(), k_scale, v_scale)

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
        check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        _check_device(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables)
        check_cache_layout(k_cache, v_cache)
        return prefill_attention(_last_dim_contiguous(q), k_cache, v_cache, cu_seqlens_q.contiguous(),
                                 seq_lens.contiguous(), _last_dim_contiguous(block_tables),
                                 max_seqlen_q, scale, k_scale=k_scale, v_scale=v_scale)

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
        check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        _check_device(q, k_cache, v_cache, seq_lens, block_tables)
        check_cache_layout(k_cache, v_cache)
        return decode_attention(_last_dim_contiguous(q), k_cache, v_cache, seq_lens.contiguous(),
                                _last_dim_contiguous(block_tables), max_seqlen_k, scale,
                                k_scale=k_scale, v_scale=v_scale)

    def decode_rope_pays(self, batch: int, num_kv_heads: int, max_seqlen_k: int, device: torch.device,
                         fp8: bool = False) -> bool:
        return fused_decode_rope_pays(batch, num_kv_heads, max_seqlen_k, device, fp8)

    def decode_with_rope(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor, block_tables: Tensor,
        max_seqlen_k: int, scale: float, rope: DecodeRope, k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        _check_device(q, k_cache, v_cache, seq_lens, block_tables, rope.k, rope.v, rope.slot_mapping)
        check_cache_layout(k_cache, v_cache)
        return decode_attention(_last_dim_contiguous(q), k_cache, v_cache, seq_lens.contiguous(),
                                _last_dim_contiguous(block_tables), max_seqlen_k, scale,
                                k_scale=k_scale, v_scale=v_scale, rope=rope)

    def decode_queries(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor, block_tables: Tensor,
        max_seqlen_k: int, scale: float, query_len: int, k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        _check_device(q, k_cache, v_cache, seq_lens, block_tables)
        check_cache_layout(k_cache, v_cache)
        return verify_attention(_last_dim_contiguous(q), k_cache, v_cache, seq_lens.contiguous(),
                                _last_dim_contiguous(block_tables), max_seqlen_k, scale, query_len,
                                k_scale=k_scale, v_scale=v_scale)
