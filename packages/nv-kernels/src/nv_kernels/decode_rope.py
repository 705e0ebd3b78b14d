"""`DecodeRope`: what a decode step's attention needs to finish its q and k itself (the fused decode path).

In a decode step each sequence brings one new token. Instead of a separate kernel that normalizes and rotates
q and k and stores k and v into the paged cache (nv_kernels.fused_rope), the decode attention kernel takes the
q/k/v projection's raw output and does it: every program normalizes and rotates its query rows, and the one
program whose split holds the new token (position seq_lens[b] - 1) stores that token's k and v into the cache
at slot_mapping[b] (slot < 0: nothing stored) before it reads the cache. Numerics as fused_rope's. Where the
batch gives each sequence one split (every program an owner) the Triton decode runs fused_rope's kernel first
instead: measured faster there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DecodeRope:
    """k, v: [B, Hkv, D] raw (before norm and rotary; strided views of the qkv output allowed, unit stride
    along D). positions, slot_mapping: [B] int64 (the new token's position and cache slot). cos_sin_cache:
    [P, D] (cos | sin halves: rotary over the whole head). q_weight / k_weight: the per-head RMSNorm weights
    [D] (None: no q/k norm, as Llama)."""

    k: Tensor
    v: Tensor
    positions: Tensor
    slot_mapping: Tensor
    cos_sin_cache: Tensor
    q_weight: Tensor | None = None
    k_weight: Tensor | None = None
    eps: float = 1e-6

    def check(self, q: Tensor, num_kv_heads: int) -> None:
        """Raise ValueError unless these fit q [B, Hq, D] and a cache of num_kv_heads heads."""
        batch, _, head_dim = q.shape
        for name, t in (("k", self.k), ("v", self.v)):
            if t.shape != (batch, num_kv_heads, head_dim) or t.stride(-1) != 1 or t.dtype != q.dtype:
                raise ValueError(f"DecodeRope.{name} must be [{batch}, {num_kv_heads}, {head_dim}] of {q.dtype} "
                                 f"with unit stride along D, got {tuple(t.shape)} {t.dtype} strides {t.stride()}")
        for name, t in (("positions", self.positions), ("slot_mapping", self.slot_mapping)):
            if t.shape != (batch,) or t.dtype != torch.int64:
                raise ValueError(f"DecodeRope.{name} must be [{batch}] int64, got {tuple(t.shape)} {t.dtype}")
        if self.cos_sin_cache.dim() != 2 or self.cos_sin_cache.shape[1] != head_dim or head_dim % 2:
            raise ValueError(f"DecodeRope needs rotary over the whole head: cos_sin_cache [P, {head_dim}], got "
                             f"{tuple(self.cos_sin_cache.shape)}")
        if (self.q_weight is None) != (self.k_weight is None):
            raise ValueError("DecodeRope takes both q_weight and k_weight or neither")
        for w in (self.q_weight, self.k_weight):
            if w is not None and (w.shape != (head_dim,) or w.dtype != q.dtype):
                raise ValueError(f"q/k norm weights must be [{head_dim}] of {q.dtype}, got {tuple(w.shape)} {w.dtype}")
