"""One backend for prefill (and mixed) steps, another for decode steps, over the same KV cache."""
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels.interface import AttentionBackend, WarmsUp


class PhaseSplitBackend:
    """Delegates prefill to `prefill_backend` and decode to `decode_backend`; both read the one cache
    layout [NB, BS, Hkv, D], so a step of either phase sees what the other phase stored. K/V stores go
    through the decode backend.

    The engine's start runs decode steps (memory profiling, CUDA-graph warm-up) but no prefill, so the
    first decode outside a graph capture also warms up a prefill backend that compiles on first use."""

    def __init__(self, prefill_backend: AttentionBackend, decode_backend: AttentionBackend) -> None:
        if prefill_backend.name == decode_backend.name:
            raise ValueError(f"both phases use {prefill_backend.name!r}: use that backend itself")
        self.prefill_backend, self.decode_backend = prefill_backend, decode_backend
        self.name = f"prefill:{prefill_backend.name},decode:{decode_backend.name}"
        self._prefill_warmed = not isinstance(prefill_backend, WarmsUp)

    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        self.decode_backend.store_kvcache(key, value, k_cache, v_cache, slot_mapping, k_scale=k_scale,
                                          v_scale=v_scale)

    def prefill(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cu_seqlens_q: Tensor,
                seq_lens: Tensor, block_tables: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                scale: float, k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
        return self.prefill_backend.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
                                            block_tables=block_tables, max_seqlen_q=max_seqlen_q,
                                            max_seqlen_k=max_seqlen_k, scale=scale, k_scale=k_scale,
                                            v_scale=v_scale)

    def decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor,
               block_tables: Tensor, max_seqlen_k: int, scale: float, k_scale: Tensor | None = None,
               v_scale: Tensor | None = None) -> Tensor:
        prefill_backend = self.prefill_backend
        if not self._prefill_warmed and isinstance(prefill_backend, WarmsUp) and not (
                k_cache.is_cuda and torch.cuda.is_current_stream_capturing()):
            prefill_backend.warm_up(q.shape[1], k_cache, v_cache)
            self._prefill_warmed = True
        return self.decode_backend.decode(q, k_cache, v_cache, seq_lens=seq_lens, block_tables=block_tables,
                                          max_seqlen_k=max_seqlen_k, scale=scale, k_scale=k_scale,
                                          v_scale=v_scale)
