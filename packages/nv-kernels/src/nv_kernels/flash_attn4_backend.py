"""FlashAttention-4 (`flash_attn.cute`, CuTe DSL kernels compiled on first use) over nv's paged KV cache.

Hopper (SM90) and Blackwell (SM100/SM110) only: FA4's paged-KV forward has no SM80 or SM120 path. One
`flash_attn_varlen_func` serves both phases:
- prefill: q [T, Hq, D] with cu_seqlens_q; keys from the cache through page_table (= block_tables, int32
  [B, pages]) with seqused_k (= seq_lens); causal masks bottom-right aligned, so each sequence's queries
  sit at the end of its context, as nv's contract says.
- decode: q [B, 1, Hq, D] (one query per row, no cu_seqlens_q); rows with seqused_k 0 (CUDA-graph
  padding) are allowed, their output is not used.
Any block size works: block_size == the kernel's key tile (128 at head_dim 128) loads pages by TMA,
other sizes gather rows with cp.async. On the TMA path a tile also loads the rows of a sequence's last
block past its length; they are masked, but must be finite (0 * NaN is NaN). nv's cache starts zeroed
and only ever holds stored K/V, so they are. fp16/bf16 only, q and cache of one dtype, head_dim a
multiple of 8 up to 256 (SM90) or up to 128 / 256 (SM100). No split-KV (FA4 splits only on SM100), so
small-batch long-context decode is slower than Triton's split-KV kernel: the registry's per-phase table
decides which backend serves which phase.

Compiles (seconds each, per dtype x head_dim x GQA group x TMA-or-not) happen in `warm_up`, which the
backend runs itself the first time it sees a cache (outside CUDA-graph capture), so the engine's start
(memory profiling, graph capture) pays them, not the first request.
"""
from __future__ import annotations

import importlib
from typing import Protocol

import torch
from torch import Tensor

from nv_kernels.interface import check_query, check_store
from nv_kernels.triton_store import store_kvcache as triton_store_kvcache

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# Prefill query lengths compiled by warm_up: FA4 specializes on whether max_seqlen_q * group fits one
# 128-row query tile (short chunks, mixed decode rows) or not (long prompts).
_WARM_UP_QUERY_LENS = (1, 256)


class VarlenAttention(Protocol):
    """The part of `flash_attn.cute.flash_attn_varlen_func` nv calls; it returns (out, lse)."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, cu_seqlens_q: Tensor | None,
                 max_seqlen_q: int | None, max_seqlen_k: int | None, seqused_k: Tensor | None,
                 page_table: Tensor | None, softmax_scale: float | None, causal: bool,
                 num_splits: int) -> tuple[Tensor, Tensor | None]: ...


def _int32(t: Tensor) -> Tensor:
    return t if t.dtype == torch.int32 and t.stride(-1) == 1 else t.to(torch.int32).contiguous()


class FlashAttn4Backend:
    """Paged prefill and decode through flash_attn.cute.flash_attn_varlen_func; Triton stores K/V."""

    name = "flash_attn"

    def __init__(self) -> None:
        module = importlib.import_module("flash_attn.cute")
        self._varlen: VarlenAttention = module.flash_attn_varlen_func
        self._warmed: set[tuple[torch.dtype, int, int, int, torch.device]] = set()

    # ---- the AttentionBackend contract -------------------------------------------------------
    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        _refuse_scales(k_scale, v_scale)
        check_store(key, value, k_cache, v_cache, slot_mapping)
        triton_store_kvcache(key, value, k_cache, v_cache, slot_mapping)

    def prefill(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cu_seqlens_q: Tensor,
                seq_lens: Tensor, block_tables: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                scale: float, k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
        _refuse_scales(k_scale, v_scale)
        hq, _ = self._check(q, k_cache, v_cache)
        self._warm_up_once(hq, k_cache, v_cache)
        return self._prefill(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q,
                             max_seqlen_k, scale)

    def decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor,
               block_tables: Tensor, max_seqlen_k: int, scale: float, k_scale: Tensor | None = None,
               v_scale: Tensor | None = None) -> Tensor:
        _refuse_scales(k_scale, v_scale)
        hq, _ = self._check(q, k_cache, v_cache)
        self._warm_up_once(hq, k_cache, v_cache)
        return self._decode(q, k_cache, v_cache, seq_lens, block_tables, max_seqlen_k, scale)

    # ---- compile ahead of the first request --------------------------------------------------
    def warm_up(self, num_q_heads: int, k_cache: Tensor, v_cache: Tensor) -> None:
        """Compile every kernel variant the engine uses for this cache (its dtype, head_dim, block size)
        and num_q_heads: prefill with short and long query chunks, and decode. Reads block 0 of the
        cache, writes nothing to it."""
        _, block_size, hkv, d = k_cache.shape
        key = (k_cache.dtype, d, num_q_heads // hkv, block_size, k_cache.device)
        dev = k_cache.device
        scale = d ** -0.5
        for q_len in _WARM_UP_QUERY_LENS:
            pages = -(-q_len // block_size)
            q = torch.zeros(q_len, num_q_heads, d, dtype=k_cache.dtype, device=dev)
            self._prefill(q, k_cache, v_cache, torch.tensor([0, q_len], dtype=torch.int32, device=dev),
                          torch.tensor([q_len], dtype=torch.int32, device=dev),
                          torch.zeros(1, pages, dtype=torch.int32, device=dev), q_len, q_len, scale)
        q = torch.zeros(1, num_q_heads, d, dtype=k_cache.dtype, device=dev)
        self._decode(q, k_cache, v_cache, torch.ones(1, dtype=torch.int32, device=dev),
                     torch.zeros(1, 1, dtype=torch.int32, device=dev), 1, scale)
        self._warmed.add(key)

    def _warm_up_once(self, num_q_heads: int, k_cache: Tensor, v_cache: Tensor) -> None:
        _, block_size, hkv, d = k_cache.shape
        key = (k_cache.dtype, d, num_q_heads // hkv, block_size, k_cache.device)
        if key in self._warmed:
            return
        if k_cache.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # never compile inside a capture; the eager run before it warms up
        self.warm_up(num_q_heads, k_cache, v_cache)

    # ---- the calls ---------------------------------------------------------------------------
    def _prefill(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor, seq_lens: Tensor,
                 block_tables: Tensor, max_seqlen_q: int, max_seqlen_k: int, scale: float) -> Tensor:
        out, _ = self._varlen(q, k_cache, v_cache, cu_seqlens_q=_int32(cu_seqlens_q), max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, seqused_k=_int32(seq_lens),
                              page_table=_int32(block_tables), softmax_scale=scale, causal=True, num_splits=1)
        return out  # [T, Hq, D]

    def _decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, block_tables: Tensor,
                max_seqlen_k: int, scale: float) -> Tensor:
        out, _ = self._varlen(q.unsqueeze(1), k_cache, v_cache, cu_seqlens_q=None, max_seqlen_q=1,
                              max_seqlen_k=max_seqlen_k, seqused_k=_int32(seq_lens),
                              page_table=_int32(block_tables), softmax_scale=scale, causal=True, num_splits=1)
        return out.squeeze(1)  # [B, 1, Hq, D] -> [B, Hq, D]

    @staticmethod
    def _check(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[int, int]:
        hq, hkv = check_query(q, k_cache, v_cache)
        if k_cache.dtype not in SUPPORTED_DTYPES or q.dtype != k_cache.dtype:
            raise ValueError(f"the flash_attn (FlashAttention-4) backend needs q and the KV cache in one of "
                             f"float16/bfloat16, got q {q.dtype} and cache {k_cache.dtype}; "
                             "use attention_backend='triton'")
        d = q.shape[2]
        if d % 8 != 0 or not 8 <= d <= 256:
            raise ValueError(f"the flash_attn (FlashAttention-4) backend needs head_dim a multiple of 8 in "
                             f"8..256, got {d}; use attention_backend='triton'")
        if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
            raise ValueError("k_cache and v_cache need equal strides and a contiguous head_dim")
        return hq, hkv


def _refuse_scales(k_scale: Tensor | None, v_scale: Tensor | None) -> None:
    if k_scale is not None or v_scale is not None:
        raise ValueError("the flash_attn (FlashAttention-4) backend cannot read nv's FP8 KV cache; "
                         "use attention_backend='triton'")
