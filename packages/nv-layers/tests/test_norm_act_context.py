"""RMSNorm (plain and fused residual), SiluAndMul, the forward context and the Attention layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nv_layers import Attention, ForwardContext, RMSNorm, SiluAndMul, forward_context, get_forward_context
from nv_layers.forward_context import current_forward_context


def reference_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return w * (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def test_rmsnorm_plain_and_fused_residual() -> None:
    norm = RMSNorm(8, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x, res = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(norm(x), reference_rms(x, norm.weight, 1e-5))
    out, new_res = norm(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, reference_rms(x + res, norm.weight, 1e-5))


def test_rmsnorm_bf16_normalises_in_fp32() -> None:
    norm = RMSNorm(8).to(torch.bfloat16)
    x = (torch.randn(3, 8) * 100).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference_rms(x, norm.weight, 1e-6))


def test_silu_and_mul() -> None:
    x = torch.randn(3, 10)
    torch.testing.assert_close(SiluAndMul()(x), F.silu(x[:, :5]) * x[:, 5:])


def make_ctx(**overrides) -> ForwardContext:
    fields = dict(is_decode=True, slot_mapping=torch.zeros(1, dtype=torch.int64),
                  seq_lens=torch.ones(1, dtype=torch.int32), block_tables=torch.zeros(1, 1, dtype=torch.int32),
                  cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=1, logits_indices=None, backend=None)
    fields.update(overrides)
    return ForwardContext(**fields)


def test_forward_context_is_scoped_and_cleared_on_error() -> None:
    with pytest.raises(RuntimeError, match="no forward context"):
        get_forward_context()
    ctx = make_ctx()
    with forward_context(ctx):
        assert get_forward_context() is ctx
    assert current_forward_context() is None
    with pytest.raises(KeyError):
        with forward_context(ctx):
            raise KeyError("boom")
    assert current_forward_context() is None


class RecordingBackend:
    """Stands in for an nv_kernels backend and records which calls the layer makes."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def store_kvcache(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        self.calls.append("store")
        assert key.shape[1:] == k_cache.shape[2:]

    def prefill(self, q, k_cache, v_cache, **kw):
        self.calls.append("prefill")
        return torch.zeros_like(q)

    def decode(self, q, k_cache, v_cache, **kw):
        self.calls.append("decode")
        return torch.ones_like(q)


def test_attention_dispatches_store_then_kernel() -> None:
    attn = Attention(num_heads=4, head_dim=2, scale=0.5, num_kv_heads=2)
    attn.k_cache = torch.zeros(3, 4, 2, 2)
    attn.v_cache = torch.zeros(3, 4, 2, 2)
    backend = RecordingBackend()
    q, k = torch.randn(2, 8), torch.randn(2, 4)
    with forward_context(make_ctx(backend=backend)):
        out = attn(q, k, k)
    assert backend.calls == ["store", "decode"] and out.shape == (2, 8) and bool((out == 1).all())
    with forward_context(make_ctx(backend=backend, is_decode=False,
                                  cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32))):
        attn(q, k, k)
    assert backend.calls[2:] == ["store", "prefill"]


def test_attention_without_cache_is_causal_per_sequence() -> None:
    attn = Attention(num_heads=2, head_dim=4, scale=0.5, num_kv_heads=1)
    q, k, v = torch.randn(5, 8), torch.randn(5, 4), torch.randn(5, 4)
    ctx = make_ctx(is_decode=False, cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32), backend=None)
    with forward_context(ctx):
        out = attn(q, k, v).view(5, 2, 4)
    # the first token of the second sequence sees only itself: output = its own v
    torch.testing.assert_close(out[2], v[2].expand(2, 4))
    torch.testing.assert_close(out[0], v[0].expand(2, 4))


def test_attention_rejects_bad_head_grouping() -> None:
    with pytest.raises(ValueError, match="multiple"):
        Attention(num_heads=3, head_dim=4, scale=1.0, num_kv_heads=2)
