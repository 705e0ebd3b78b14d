"""The attention layer: writes this step's K/V into the paged cache, then runs the backend kernel.

It reads everything per step from the forward context (slot mapping, block tables, lengths, backend);
the runner assigns `k_cache` / `v_cache` ([NB, BS, Hkv, D] each) after allocating the KV cache.

An FP8 cache (nv_kernels.kv_quant) is read and written with this layer's `k_scale` / `v_scale`
([Hkv, D] float32 buffers on the device, one per KV head and channel): the checkpoint's per-tensor
scale broadcast (load_kv_scale), or set by the runner from a calibration run (start_kv_calibration /
the per-channel amax this layer records) before the cache is allocated.
"""
from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from nv_kernels.decode_rope import DecodeRope
from nv_kernels.kv_quant import is_fp8
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
        self.k_scale: torch.Tensor      # [Hkv, D] float32: an FP8 cache holds K / k_scale
        self.v_scale: torch.Tensor
        self.register_buffer("k_scale", torch.ones(num_kv_heads, head_dim, dtype=torch.float32), persistent=False)
        self.register_buffer("v_scale", torch.ones(num_kv_heads, head_dim, dtype=torch.float32), persistent=False)
        self.kv_scales_loaded: set[str] = set()        # "k" / "v": scales the checkpoint gave
        self.kv_amax: torch.Tensor | None = None       # [2, Hkv, D] max |K|, |V| seen while calibrating

    # ---- FP8 scales ---------------------------------------------------------------------------
    def load_kv_scale(self, which: str, value: torch.Tensor) -> None:
        """A checkpoint's k_scale / v_scale ("k" or "v"; one element, per tensor) for an FP8 cache."""
        if which not in ("k", "v") or value.numel() != 1:
            raise ValueError(f"a KV-cache scale is one number for 'k' or 'v', got {which!r} of shape "
                             f"{tuple(value.shape)}")
        scale = float(value.float().reshape(()))
        if not scale > 0 or scale == float("inf"):
            raise ValueError(f"the checkpoint's {which}_scale must be positive and finite, got {scale}")
        (self.k_scale if which == "k" else self.v_scale).fill_(scale)
        self.kv_scales_loaded.add(which)

    def start_kv_calibration(self) -> None:
        """Record max |K| and |V| per KV head and channel of every forward from now on (kv_amax)."""
        self.kv_amax = torch.zeros(2, self.num_kv_heads, self.head_dim, dtype=torch.float32,
                                   device=self.k_scale.device)

    def kv_scale_kwargs(self) -> dict[str, torch.Tensor]:
        """{"k_scale", "v_scale"} when the cache is FP8 (the backends' and fused store's keywords), else {}."""
        if not is_fp8(self.k_cache.dtype):
            return {}
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_stored: bool = False) -> torch.Tensor:
        # q [T, Hq*D], k/v [T, Hkv*D] -> [T, Hq*D]; kv_stored: the caller already wrote k/v into
        # k_cache/v_cache at ctx.slot_mapping (a fused kernel did), so the backend's store is skipped
        ctx = get_forward_context()
        num_tokens = q.shape[0]
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.kv_amax is not None and num_tokens:
            seen = torch.stack([k.detach().abs().amax(0), v.detach().abs().amax(0)]).float()   # [2, Hkv, D]
            self.kv_amax = torch.maximum(self.kv_amax, seen)
        if self.k_cache.numel() == 0:
            out = self._attend_without_cache(q, k, v, ctx)
        elif ctx.attention_split is not None:
            out = ctx.attention_split(self, q, k, v, kv_stored)
        else:
            if not kv_stored:
                self.store_kv(k, v, ctx)
            out = self.attend_cached(q, ctx)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> None:
        """Write k/v [T, Hkv, D] into the cache at ctx.slot_mapping (slot < 0: skipped)."""
        ctx.backend.store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping, **self.kv_scale_kwargs())

    def attend_cached(self, q: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q [T, Hq, D] over the cache, which already holds this step's K/V -> [T, Hq, D]."""
        backend = ctx.backend
        scales = self.kv_scale_kwargs()   # FP8 cache only: backends without FP8 never see them
        if ctx.is_decode and ctx.query_len > 1:   # nv_kernels.interface.DecodesQueries
            return backend.decode_queries(q, self.k_cache, self.v_cache, seq_lens=ctx.seq_lens,
                                          block_tables=ctx.block_tables, max_seqlen_k=ctx.max_seqlen_k,
                                          scale=self.scale, query_len=ctx.query_len, **scales)
        if ctx.is_decode:
            return backend.decode(q, self.k_cache, self.v_cache, seq_lens=ctx.seq_lens,
                                  block_tables=ctx.block_tables, max_seqlen_k=ctx.max_seqlen_k,
                                  scale=self.scale, **scales)
        return backend.prefill(q, self.k_cache, self.v_cache, cu_seqlens_q=ctx.cu_seqlens_q,
                               seq_lens=ctx.seq_lens, block_tables=ctx.block_tables,
                               max_seqlen_q=ctx.max_seqlen_q, max_seqlen_k=ctx.max_seqlen_k,
                               scale=self.scale, **scales)

    def attend_decode_with_rope(self, q: torch.Tensor, rope: DecodeRope, ctx: ForwardContext) -> torch.Tensor:
        """A decode step on a backend that finishes q and k itself (nv_kernels.decode_rope): q [B, Hq, D] raw,
        rope's k / v the new tokens' raw heads, stored by the kernel -> [B, Hq, D]."""
        decode = getattr(ctx.backend, "decode_with_rope", None)   # nv_kernels.interface.DecodesWithRope
        if decode is None:
            raise TypeError(f"the {ctx.backend.name} backend cannot finish q and k in its decode")
        return decode(q, self.k_cache, self.v_cache, seq_lens=ctx.seq_lens, block_tables=ctx.block_tables,
                      max_seqlen_k=ctx.max_seqlen_k, scale=self.scale, rope=rope, **self.kv_scale_kwargs())

    def _attend_without_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              ctx: ForwardContext) -> torch.Tensor:
        """Causal attention within each sequence of this batch only (memory-profiling runs)."""
        if ctx.cu_seqlens_q is None or ctx.is_decode:
            bounds = list(range(0, q.shape[0] + 1, ctx.query_len))   # query_len tokens per sequence
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
