"""The attention layer: writes this step's K/V into the paged cache, then runs the backend kernel.

It reads everything per step from the forward context (slot mapping, block tables, lengths, backend);
the runner assigns `k_cache` / `v_cache` ([NB, BS, Hkv, D] each) after allocating the KV cache.
"""
from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from nv_layers.forward_context import ForwardContext, get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.k_cache = torch.empty(0)   # [NB, BS, Hkv, D] once the runner assigns it
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_stored: bool = False) -> torch.Tensor:
        # q [T, Hq*D], k/v [T, Hkv*D] -> [T, Hq*D]; kv_stored: the caller already wrote k/v into
        # k_cache/v_cache at ctx.slot_mapping (a fused kernel did), so the backend's store is skipped
        ctx = get_forward_context()
        num_tokens = q.shape[0]
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel() == 0:
            out = self._attend_without_cache(q, k, v, ctx)
        else:
            backend = ctx.backend
            if not kv_stored:
                backend.store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
            if ctx.is_decode:
                out = backend.decode(q, self.k_cache, self.v_cache, seq_lens=ctx.seq_lens,
                                     block_tables=ctx.block_tables, max_seqlen_k=ctx.max_seqlen_k,
                                     scale=self.scale)
            else:
                out = backend.prefill(q, self.k_cache, self.v_cache, cu_seqlens_q=ctx.cu_seqlens_q,
                                      seq_lens=ctx.seq_lens, block_tables=ctx.block_tables,
                                      max_seqlen_q=ctx.max_seqlen_q, max_seqlen_k=ctx.max_seqlen_k,
                                      scale=self.scale)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def _attend_without_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              ctx: ForwardContext) -> torch.Tensor:
        """Causal attention within each sequence of this batch only (memory-profiling runs)."""
        if ctx.cu_seqlens_q is None or ctx.is_decode:
            bounds = list(range(q.shape[0] + 1))          # one token per sequence
        else:
            bounds = ctx.cu_seqlens_q.tolist()             # host sync: fine, profiling only
        group = self.num_heads // self.num_kv_heads
        out = torch.empty_like(q)                          # [T, Hq, D]
        for start, end in pairwise(bounds):
            if end <= start:
                continue
            qs = q[start:end].transpose(0, 1)                                   # [Hq, L, D]
            ks = k[start:end].transpose(0, 1).repeat_interleave(group, dim=0)   # [Hq, L, D]
            vs = v[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale)
            out[start:end] = o.transpose(0, 1)
        return out
