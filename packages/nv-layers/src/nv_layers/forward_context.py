"""The per-forward context that attention and the LM head read.

The runner builds one ForwardContext per step and runs the model inside `forward_context(ctx)`;
the context is cleared when the block exits (also on exceptions), so no state leaks into a later step.
Ideas from nano-vllm's context and mini-sglang's scoped forward batch; no sequences in here.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

_CURRENT: ForwardContext | None = None


@dataclass
class ForwardContext:
    is_decode: bool                          # pure decode batch (one token per sequence)
    slot_mapping: torch.Tensor               # [T] slot = block * BS + offset; < 0 skips the token
    seq_lens: torch.Tensor                   # [B] int32, context length incl. this step's tokens
    block_tables: torch.Tensor               # [B, M] int32
    cu_seqlens_q: torch.Tensor | None        # [B+1] int32 (prefill / mixed)
    max_seqlen_q: int
    max_seqlen_k: int
    logits_indices: torch.Tensor | None      # [S] hidden rows whose logits are wanted; None = all
    backend: Any                             # nv_kernels.AttentionBackend
    # Set while a runner cuts the model body at its attentions (CUDA graphs of mixed steps): each attention
    # layer with a KV cache hands (layer, q [T, Hq, D], k, v [T, Hkv, D], kv_stored) to it and returns what it
    # returns ([T, Hq, D]) instead of attending itself.
    attention_split: Callable[..., torch.Tensor] | None = None
    # A decode batch with several query tokens per sequence (speculative decoding's verify steps in CUDA graphs):
    # sequence b owns rows b * query_len .. b * query_len + query_len - 1, the last query_len positions of its
    # seq_lens[b] context (front padding rows have slot -1); backends answer it with decode_queries.
    query_len: int = 1


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    """Set ctx for the block, restore the previous one (normally none) afterwards."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, ctx
    try:
        yield ctx
    finally:
        _CURRENT = previous


def get_forward_context() -> ForwardContext:
    if _CURRENT is None:
        raise RuntimeError("no forward context is set: run the model inside `with forward_context(ctx):`")
    return _CURRENT


def current_forward_context() -> ForwardContext | None:
    """The context set now, or None (for layers that also work without one)."""
    return _CURRENT
