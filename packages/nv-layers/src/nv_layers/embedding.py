"""Vocab-parallel embedding and LM head (design after nano-vllm's embed_head / vLLM).

The vocabulary is split into tp_size equal ranges of ceil(V / tp) rows; the last range is padded
with zero rows, so any vocab size works with any TP size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nv_layers.forward_context import current_forward_context
from nv_layers.parallel_state import get_tp_rank, get_tp_size, tp_all_gather_last_dim, tp_all_reduce
from nv_layers.weights import WeightLike, check_shape, copy_checked, read_shard, set_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        self.num_per_rank = -(-num_embeddings // self.tp_size)          # ceil
        self.vocab_start = self.tp_rank * self.num_per_rank
        self.vocab_end = min(self.vocab_start + self.num_per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.num_per_rank, embedding_dim), requires_grad=False)
        set_weight_loader(self.weight, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        rows = max(self.vocab_end - self.vocab_start, 0)
        check_shape(loaded_weight, (self.num_embeddings, param.shape[1]), "embedding")
        param.data[rows:].zero_()
        if rows:
            copy_checked(param.data[:rows], read_shard(loaded_weight, 0, self.vocab_start, rows), "embedding")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids [T] -> [T, hidden]
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        in_range = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(in_range, input_ids - self.vocab_start, torch.zeros_like(input_ids))
        y = F.embedding(local_ids, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return tp_all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [T, H] -> full-vocab logits [S, V] on every rank (all-gather over the TP group).

    Inside a forward context it keeps only ctx.logits_indices rows before the matmul, so prefill
    computes logits just for the rows that sample. Tie it to an embedding with `tie_to(embedding)`.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        if bias:
            raise ValueError("ParallelLMHead does not support a bias")

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        if embedding.weight.shape != self.weight.shape:
            raise ValueError("tied LM head and embedding must have the same shape")
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx = current_forward_context()
        if ctx is not None and ctx.logits_indices is not None:
            hidden = hidden.index_select(0, ctx.logits_indices)       # [S, H]
        logits = F.linear(hidden, self.weight)                         # [S, V_rank]
        logits = tp_all_gather_last_dim(logits)                        # [S, V_rank * tp]
        if logits.shape[-1] != self.num_embeddings:                    # drop the padding rows' logits
            logits = logits[..., : self.num_embeddings].contiguous()
        return logits                                                  # [S, V]
