"""A minimal driver that runs a model over a hand-managed paged KV cache.

For tests and examples only (the engine's ModelRunner does this for real): it owns the per-layer
caches, hands out blocks, builds the ForwardContext of each step and supports prefix sharing
(a new sequence reusing another's full blocks) and chunked prefill.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from nv_layers.attention import Attention
from nv_layers.forward_context import ForwardContext, forward_context


@dataclass
class _Seq:
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    computed: int = 0                 # tokens whose K/V is in the cache


class PagedDriver:
    def __init__(self, model: nn.Module, *, num_blocks: int, block_size: int, backend,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        self.model, self.block_size, self.backend, self.device = model, block_size, backend, device
        self.free_blocks = list(range(num_blocks))
        self.seqs: dict[int, _Seq] = {}
        for module in model.modules():
            if isinstance(module, Attention):
                shape = (num_blocks, block_size, module.num_kv_heads, module.head_dim)
                module.k_cache = torch.zeros(shape, dtype=dtype, device=device)
                module.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    def add(self, seq_id: int, tokens: list[int], *, share_from: int | None = None,
            num_shared_blocks: int = 0) -> None:
        """New sequence; with share_from, its first num_shared_blocks blocks are that sequence's (a prefix hit)."""
        seq = _Seq(list(tokens))
        if share_from is not None:
            src = self.seqs[share_from]
            n = num_shared_blocks * self.block_size
            if src.tokens[:n] != seq.tokens[:n] or src.computed < n:
                raise ValueError("shared blocks must hold computed tokens equal to the new prompt's prefix")
            seq.blocks, seq.computed = src.blocks[:num_shared_blocks], n
        self.seqs[seq_id] = seq

    def append(self, seq_id: int, token: int) -> None:
        self.seqs[seq_id].tokens.append(token)

    def step(self, chunks: list[tuple[int, int]]) -> torch.Tensor:
        """Compute (seq_id, num_new_tokens) chunks in one batch; logits [S, V] of chunks reaching the end."""
        ids, positions, slots, cu, lens, tables, sample_rows = [], [], [], [0], [], [], []
        for seq_id, n in chunks:
            seq = self.seqs[seq_id]
            start, end = seq.computed, seq.computed + n
            if n < 1 or end > len(seq.tokens):
                raise ValueError(f"sequence {seq_id}: cannot compute tokens {start}..{end}")
            while len(seq.blocks) * self.block_size < end:
                seq.blocks.append(self.free_blocks.pop(0))
            ids += seq.tokens[start:end]
            positions += range(start, end)
            slots += [seq.blocks[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(start, end)]
            cu.append(cu[-1] + n)
            lens.append(end)
            tables.append(seq.blocks)
            if end == len(seq.tokens):
                sample_rows.append(cu[-1] - 1)
        width = max(len(t) for t in tables)
        is_decode = all(n == 1 for _, n in chunks) and len(sample_rows) == len(chunks)
        dev = self.device

        def i32(x: list) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=dev)

        ctx = ForwardContext(
            is_decode=is_decode,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            seq_lens=i32(lens),
            block_tables=i32([t + [0] * (width - len(t)) for t in tables]),
            cu_seqlens_q=None if is_decode else i32(cu),
            max_seqlen_q=max(n for _, n in chunks),
            max_seqlen_k=max(lens),
            logits_indices=None if is_decode else torch.tensor(sample_rows, dtype=torch.int64, device=dev),
            backend=self.backend,
        )
        with torch.no_grad(), forward_context(ctx):
            hidden = self.model(torch.tensor(ids, dtype=torch.int64, device=dev),
                                torch.tensor(positions, dtype=torch.int64, device=dev))
            logits = self.model.compute_logits(hidden)  # pyright: ignore[reportCallIssue] - an nn.Module attribute
        for seq_id, n in chunks:
            self.seqs[seq_id].computed += n
        return logits


def cacheless_prefill_context(seq_lens: list[int], backend) -> ForwardContext:
    """A prefill of whole sequences (their tokens back to back) with no KV cache: attention is causal
    within each sequence only, as in the engine's memory-profiling run. Logits for every token."""
    cu = [0]
    for n in seq_lens:
        cu.append(cu[-1] + n)
    return ForwardContext(is_decode=False, slot_mapping=torch.full((cu[-1],), -1), seq_lens=torch.tensor(seq_lens),
                          block_tables=torch.zeros(len(seq_lens), 1, dtype=torch.int32),
                          cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), max_seqlen_q=max(seq_lens),
                          max_seqlen_k=max(seq_lens), logits_indices=None, backend=backend)
