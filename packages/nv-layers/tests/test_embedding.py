"""Vocab-parallel embedding and LM head, with TP ranks emulated in one process."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nv_layers.embedding as embedding
from nv_layers import ForwardContext, ParallelLMHead, VocabParallelEmbedding, forward_context

VOCAB, DIM = 11, 4          # 11 rows do not split evenly: the last rank holds padding rows


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setattr(embedding, "get_tp_rank", lambda: rank)
    monkeypatch.setattr(embedding, "get_tp_size", lambda: size)


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_embedding_shards_sum_to_full(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    w = torch.randn(VOCAB, DIM)
    ids = torch.tensor([0, 3, 5, 6, 10, 7])
    total = torch.zeros(len(ids), DIM)
    monkeypatch.setattr(embedding, "tp_all_reduce", lambda y: y)      # sum by hand below
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        layer = VocabParallelEmbedding(VOCAB, DIM)
        layer.weight.data.fill_(float("nan"))
        layer.weight.weight_loader(layer.weight, w)
        assert not layer.weight.isnan().any()                          # padding rows zeroed
        total += layer(ids)
    torch.testing.assert_close(total, F.embedding(ids, w))


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_lm_head_gathers_full_vocab(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    w, hidden = torch.randn(VOCAB, DIM), torch.randn(5, DIM)
    parts = []
    monkeypatch.setattr(embedding, "tp_all_gather_last_dim", lambda x: x)
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        head = ParallelLMHead(VOCAB, DIM)
        head.weight.weight_loader(head.weight, w)
        parts.append(head(hidden))
    gathered = torch.cat(parts, -1)[:, :VOCAB]
    torch.testing.assert_close(gathered, hidden @ w.T)


def test_lm_head_applies_logits_indices_and_ties() -> None:
    emb, head = VocabParallelEmbedding(VOCAB, DIM), ParallelLMHead(VOCAB, DIM)
    emb.weight.weight_loader(emb.weight, torch.randn(VOCAB, DIM))
    head.tie_to(emb)
    assert head.weight is emb.weight
    hidden = torch.randn(6, DIM)
    ctx = ForwardContext(is_decode=False, slot_mapping=torch.zeros(6), seq_lens=torch.zeros(2),
                         block_tables=torch.zeros(2, 1), cu_seqlens_q=torch.tensor([0, 2, 6]), max_seqlen_q=4,
                         max_seqlen_k=4, logits_indices=torch.tensor([1, 5]), backend=None)
    with forward_context(ctx):
        logits = head(hidden)
    torch.testing.assert_close(logits, hidden[[1, 5]] @ emb.weight.T)
    assert head(hidden).shape == (6, VOCAB)                           # no context: every row


def test_embedding_rejects_wrong_checkpoint_shape() -> None:
    layer = VocabParallelEmbedding(VOCAB, DIM)
    with pytest.raises(ValueError, match="embedding"):
        layer.weight.weight_loader(layer.weight, torch.randn(VOCAB + 1, DIM))
