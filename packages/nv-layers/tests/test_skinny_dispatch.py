"""The layers' dispatch to the skinny GEMM (nv_kernels.skinny_gemm; interpreted on CPU with fused ops forced
"on", standing in for CUDA): which projections take it, and a bf16 decoder gives the same output with the
switch on or off. The root conftest sets TRITON_INTERPRET=1 before anything imports triton without a GPU.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import nv_layers.decoder as decoder
import nv_layers.linear as linear
from nv_kernels import fused_ops, get_backend
from nv_kernels import skinny_gemm as skinny
from nv_kernels.skinny_gemm_kernel import skinny_gemm_kernel
from nv_kernels.testing import relative_error
from nv_layers import forward_context
from nv_layers.decoder import DecoderForCausalLM, GatedMLP, LayerOptions
from nv_layers.linear import ReplicatedLinear, RowParallelLinear
from nv_layers.testing import cacheless_prefill_context

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available()
    or type(skinny_gemm_kernel).__name__ != "InterpretedFunction",
    reason="needs the Triton interpreter on a machine without a GPU (the GPU runs the kernels in their own tests)")

VOCAB, HIDDEN, LAYERS = 40, 32, 2   # layer 0 has no residual yet, layer 1 adds it
CONFIG = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
              max_position_embeddings=32, rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
              tie_word_embeddings=False)


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread() -> Iterator[None]:
    """Tiny models run far faster on one thread (and do not stall on a busy machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, bool]]]:
    """(rows of x, gated) of every skinny GEMM the layers launch."""
    seen: list[tuple[int, bool]] = []

    def spy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        seen.append((x.shape[0], bool(kwargs.get("gated", False))))
        return skinny.skinny_gemm(x, weight, bias, **kwargs)

    def norm_spy(x: torch.Tensor, residual: torch.Tensor | None, *args: Any, **kwargs: Any
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((-x.shape[0], bool(kwargs.get("gated", False))))   # negative rows: the norm is fused
        return skinny.skinny_norm_gemm(x, residual, *args, **kwargs)

    monkeypatch.setattr(linear, "skinny_gemm", spy)
    monkeypatch.setattr(decoder, "skinny_gemm", spy)
    monkeypatch.setattr(decoder, "skinny_norm_gemm", norm_spy)
    yield seen


def bf16_model(seed: int) -> DecoderForCausalLM:
    class Model(DecoderForCausalLM):
        @classmethod
        def layer_options(cls, config: Any) -> LayerOptions:
            return LayerOptions(qk_norm=True, qkv_bias=True, o_bias=True, mlp_bias=True)

    model = Model(SimpleNamespace(**CONFIG))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fill = torch.rand(p.shape, generator=gen) + 0.5 if name.endswith("norm.weight") else \
                torch.randn(p.shape, generator=gen) * 0.2
            p.copy_(fill)
    return model.to(torch.bfloat16).eval()


def forward(model: DecoderForCausalLM, num_tokens: int, skinny_on: bool) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (num_tokens,), generator=torch.Generator().manual_seed(1))
    previous = skinny.set_skinny_gemm(skinny_on)
    try:
        with fused_ops("on"), torch.no_grad(), \
                forward_context(cacheless_prefill_context([num_tokens], get_backend("torch"))):
            return model.compute_logits(model(ids, torch.arange(num_tokens)))
    finally:
        skinny.set_skinny_gemm(previous)


def test_decoder_same_output_with_the_switch_on_or_off(calls: list[tuple[int, bool]]) -> None:
    model = bf16_model(seed=0)
    fast = forward(model, 5, skinny_on=True)
    # per layer: add + norm + qkv, o, add + norm + gate_up + SiLU-and-mul, down; the LM head is not a LinearBase
    assert calls == [(-5, False), (5, False), (-5, True), (5, False)] * LAYERS
    calls.clear()
    plain = forward(model, 5, skinny_on=False)
    assert calls == []
    assert bool(torch.isfinite(fast).all())
    assert relative_error(fast, plain) < 2e-2                  # bf16 roundings of a layer's GEMMs


def test_more_than_16_tokens_take_torch(calls: list[tuple[int, bool]]) -> None:
    mlp = bf16_model(seed=1).model.layers[0].mlp
    assert isinstance(mlp, GatedMLP)
    x = torch.randn(17, HIDDEN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with fused_ops("on"), torch.no_grad():
        out = mlp(x)
        assert calls == []
        assert relative_error(mlp(x[:16]), out[:16]) < 2e-2                      # the kernel, at 16 rows
    assert calls == [(16, True), (16, False)]


def test_row_parallel_reduces_then_adds_bias_once(calls: list[tuple[int, bool]]) -> None:
    gen = torch.Generator().manual_seed(2)
    row = RowParallelLinear(32, 16, bias=True).to(torch.bfloat16)
    rep = ReplicatedLinear(32, 16, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        for layer in (row, rep):
            layer.weight.copy_(torch.randn(16, 32, generator=gen))
            assert layer.bias is not None
            layer.bias.copy_(torch.randn(16, generator=gen))
    x = torch.randn(3, 32, generator=gen).to(torch.bfloat16)
    with fused_ops("on"):
        for layer in (row, rep):
            out = layer(x)
            ref = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
            assert relative_error(out, ref) < 8e-3
    assert calls == [(3, False), (3, False)]
