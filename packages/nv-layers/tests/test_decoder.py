"""nv_layers.decoder without a model package: LayerOptions shape the layers, tied heads, TP checks,
and one forward without a KV cache equals a hand-written torch forward of the same weights."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import nv_layers.decoder as decoder
from nv_kernels import get_backend
from nv_layers import forward_context
from nv_layers.decoder import DecoderForCausalLM, LayerOptions
from nv_layers.testing import cacheless_prefill_context

CONFIG = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6, max_position_embeddings=32, rope_theta=10000.0,
              rope_scaling=None, hidden_act="silu")


def make(opts: LayerOptions, **overrides) -> DecoderForCausalLM:
    class Model(DecoderForCausalLM):
        @classmethod
        def layer_options(cls, config):
            return opts
    return Model(SimpleNamespace(**{**CONFIG, "tie_word_embeddings": False, **overrides}))


ALL_ON = LayerOptions(qk_norm=True, qkv_bias=True, o_bias=True, mlp_bias=True)


@pytest.mark.parametrize("opts", [LayerOptions(), ALL_ON])
def test_layer_options_shape_the_layers(opts: LayerOptions) -> None:
    layer = make(opts).model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert (attn.qkv_proj.bias is not None, attn.o_proj.bias is not None) == (opts.qkv_bias, opts.o_bias)
    assert (mlp.gate_up_proj.bias is not None, mlp.down_proj.bias is not None) == (opts.mlp_bias, opts.mlp_bias)
    assert hasattr(attn, "q_norm") == opts.qk_norm
    assert attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 4, 16) and mlp.gate_up_proj.weight.shape == (48, 16)


def test_tied_head_and_tp_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make(LayerOptions(), tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    monkeypatch.setattr(decoder, "get_tp_size", lambda: 3)
    with pytest.raises(ValueError, match="num_attention_heads"):
        make(LayerOptions())


def reference_forward(model: DecoderForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Plain torch: pre-norm decoder, q/k norm, rotate-half rope, causal GQA softmax attention, SwiGLU."""
    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    t, hq, hkv, d = len(ids), 4, 2, 4
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(t).float()[:, None] * inv[None]                     # [T, D/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(x):                                                          # [T, H, D]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    h = model.model.embed_tokens.weight[ids]
    for layer in model.model.layers:
        a = layer.self_attn
        x = rms(h, layer.input_layernorm.weight)
        q, k, v = F.linear(x, a.qkv_proj.weight, a.qkv_proj.bias).split([hq * d, hkv * d, hkv * d], -1)
        q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
        q, k = rms(q, a.q_norm.weight), rms(k, a.k_norm.weight)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(t, -1)
        h = h + F.linear(o, a.o_proj.weight, a.o_proj.bias)
        x = rms(h, layer.post_attention_layernorm.weight)
        gate, up = F.linear(x, layer.mlp.gate_up_proj.weight, layer.mlp.gate_up_proj.bias).chunk(2, -1)
        h = h + F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight,
                                           layer.mlp.down_proj.bias)
    return F.linear(rms(h, model.model.norm.weight), model.lm_head.weight)


def test_forward_equals_a_plain_torch_decoder() -> None:
    torch.manual_seed(0)
    model = make(ALL_ON).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    ids = torch.randint(0, 40, (7,))
    with torch.no_grad(), forward_context(cacheless_prefill_context([7], get_backend("torch"))):
        logits = model.compute_logits(model(ids, torch.arange(7)))
        expected = reference_forward(model, ids)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
