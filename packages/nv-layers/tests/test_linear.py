"""Weight loaders of the parallel linear layers, with TP ranks emulated in one process.

Each emulated rank loads its shard from the full checkpoint tensor; the shards must reassemble the
unsharded layer's output (concatenation for column layers, sum for row layers). The real multi-process
check with gloo is tests/test_tp_layers.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import nv_layers.linear as linear
from nv_layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setattr(linear, "get_tp_rank", lambda: rank)
    monkeypatch.setattr(linear, "get_tp_size", lambda: size)


def test_replicated_loads_whole_tensor() -> None:
    layer = ReplicatedLinear(3, 5, bias=True)
    w, b = torch.randn(5, 3), torch.randn(5)
    layer.weight.weight_loader(layer.weight, w)
    layer.bias.weight_loader(layer.bias, b)
    x = torch.randn(2, 3)
    torch.testing.assert_close(layer(x), F.linear(x, w, b))
    with pytest.raises(ValueError, match="shape"):
        layer.weight.weight_loader(layer.weight, torch.randn(4, 3))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_shards_concatenate_to_full(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    w, b, x = torch.randn(8, 6), torch.randn(8), torch.randn(3, 6)
    outs = []
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        layer = ColumnParallelLinear(6, 8, bias=True)
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        outs.append(layer(x))
    torch.testing.assert_close(torch.cat(outs, -1), F.linear(x, w, b))


@pytest.mark.parametrize("tp", [1, 2])
def test_row_shards_sum_to_full(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    w, b, x = torch.randn(5, 8), torch.randn(5), torch.randn(3, 8)
    total = torch.zeros(3, 5)
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        layer = RowParallelLinear(8, 5, bias=False)
        layer.weight.weight_loader(layer.weight, w)
        total += layer(x.chunk(tp, -1)[rank])
    torch.testing.assert_close(total, F.linear(x, w))
    as_rank(monkeypatch, 1, 2)
    layer = RowParallelLinear(8, 5, bias=True)
    layer.bias.weight_loader(layer.bias, b)
    torch.testing.assert_close(layer.bias.data, b)           # bias is replicated


@pytest.mark.parametrize("tp,heads,kv_heads", [(1, 4, 2), (2, 4, 2), (2, 4, 1), (4, 4, 2)])
def test_qkv_shards_take_this_ranks_heads(monkeypatch: pytest.MonkeyPatch, tp: int, heads: int,
                                          kv_heads: int) -> None:
    d, hidden = 3, 10
    wq, wk, wv = torch.randn(heads * d, hidden), torch.randn(kv_heads * d, hidden), torch.randn(kv_heads * d, hidden)
    bq, bk, bv = torch.randn(heads * d), torch.randn(kv_heads * d), torch.randn(kv_heads * d)
    x = torch.randn(2, hidden)
    q_parts = []
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        layer = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True)
        for sid, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
            layer.weight.weight_loader(layer.weight, w, sid)
            layer.bias.weight_loader(layer.bias, b, sid)
        q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], -1)
        q_parts.append(q)
        kv_head = rank * kv_heads // tp if kv_heads >= tp else rank // (tp // kv_heads)
        n = layer.num_kv_heads * d
        torch.testing.assert_close(k, F.linear(x, wk, bk)[:, kv_head * d: kv_head * d + n])
        torch.testing.assert_close(v, F.linear(x, wv, bv)[:, kv_head * d: kv_head * d + n])
    torch.testing.assert_close(torch.cat(q_parts, -1), F.linear(x, wq, bq))


def test_qkv_fused_checkpoint_tensor_equals_separate(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 1, 2)
    wq, wk, wv = torch.randn(8, 5), torch.randn(4, 5), torch.randn(4, 5)
    a, b = QKVParallelLinear(5, 2, 4, 2), QKVParallelLinear(5, 2, 4, 2)
    for sid, w in (("q", wq), ("k", wk), ("v", wv)):
        a.weight.weight_loader(a.weight, w, sid)
    b.weight.weight_loader(b.weight, torch.cat([wq, wk, wv]))
    torch.testing.assert_close(a.weight, b.weight)
    with pytest.raises(ValueError, match="shard id"):
        a.weight.weight_loader(a.weight, wq, "x")


def test_qkv_rejects_indivisible_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 2)
    with pytest.raises(ValueError, match="num_attention_heads"):
        QKVParallelLinear(8, 2, 3, 3)
    as_rank(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        QKVParallelLinear(8, 2, 12, 3)


@pytest.mark.parametrize("tp", [1, 2])
def test_merged_column_shards(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    gate, up, x = torch.randn(6, 4), torch.randn(6, 4), torch.randn(3, 4)
    gate_parts, up_parts = [], []
    for rank in range(tp):
        as_rank(monkeypatch, rank, tp)
        layer = MergedColumnParallelLinear(4, [6, 6])
        layer.weight.weight_loader(layer.weight, gate, 0)
        layer.weight.weight_loader(layer.weight, up, 1)
        g, u = layer(x).chunk(2, -1)
        gate_parts.append(g)
        up_parts.append(u)
        fused = MergedColumnParallelLinear(4, [6, 6])
        fused.weight.weight_loader(fused.weight, torch.cat([gate, up]))
        torch.testing.assert_close(fused.weight, layer.weight)
    torch.testing.assert_close(torch.cat(gate_parts, -1), F.linear(x, gate))
    torch.testing.assert_close(torch.cat(up_parts, -1), F.linear(x, up))


def test_column_rejects_indivisible_output(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 2)
    with pytest.raises(ValueError, match="not divisible"):
        ColumnParallelLinear(4, 7)


def test_loaders_read_lazy_safetensors_slices(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    w, w_row = torch.randn(8, 6), torch.randn(6, 8)
    save_file({"w": w, "w_row": w_row}, str(tmp_path / "w.safetensors"))
    as_rank(monkeypatch, 1, 2)
    col, row = ColumnParallelLinear(6, 8), RowParallelLinear(8, 6)
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        col.weight.weight_loader(col.weight, f.get_slice("w"))
        row.weight.weight_loader(row.weight, f.get_slice("w_row"))
    torch.testing.assert_close(col.weight.data, w[4:])
    torch.testing.assert_close(row.weight.data, w_row[:, 4:])
