"""The layers' dispatch of block-FP8 weights at decode batch sizes to nv_kernels.fp8_skinny_gemm (interpreted on
CPU with fused ops forced "on", standing in for CUDA): every projection of a quantized decoder takes it, gate_up
with SiLU-and-mul fused, and the logits match those of the same forward with the skinny switch off and the block
GEMM standing in as a W8A16 torch reference; more than 16 rows keep the W8A8 block GEMM.
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
from nv_kernels import fp8_skinny_gemm as fp8_skinny
from nv_kernels import fused_ops, get_backend
from nv_kernels.fp8_skinny_gemm_kernel import fp8_skinny_gemm_kernel
from nv_kernels.skinny_gemm import set_skinny_gemm
from nv_kernels.testing import relative_error
from nv_layers import forward_context
from nv_layers.decoder import DecoderForCausalLM, GatedMLP, LayerOptions
from nv_layers.linear import LinearBase
from nv_layers.testing import cacheless_prefill_context

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available()
    or type(fp8_skinny_gemm_kernel).__name__ != "InterpretedFunction",
    reason="needs the Triton interpreter on a machine without a GPU (the GPU runs the kernels in their own tests)")

VOCAB, HIDDEN, LAYERS = 40, 64, 2
CONFIG = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
              max_position_embeddings=32, rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
              tie_word_embeddings=False)


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, bool]]]:
    """(rows of x, gated) of every FP8 skinny GEMM the layers launch; rows of a W8A8 block GEMM as (-rows, False)."""
    seen: list[tuple[int, bool]] = []

    def spy(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
            **kwargs: Any) -> torch.Tensor:
        seen.append((x.shape[0], bool(kwargs.get("gated", False))))
        return fp8_skinny.fp8_skinny_gemm(x, w_q, scale, bias, **kwargs)

    def block_spy(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
                  ) -> torch.Tensor:
        seen.append((-x.shape[0], False))
        return fp8_skinny.fp8_skinny_gemm_torch(x, w_q, scale, bias)   # W8A16, the numerics of the skinny kernel

    monkeypatch.setattr(linear, "fp8_skinny_gemm", spy)
    monkeypatch.setattr(decoder, "fp8_skinny_gemm", spy)
    monkeypatch.setattr(linear, "fp8_block_gemm", block_spy)
    yield seen


def fp8_model(seed: int) -> DecoderForCausalLM:
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
        model = model.to(torch.bfloat16).eval()
        for module in model.modules():
            if isinstance(module, LinearBase):
                module.quantize_fp8_block()
    return model


def forward(model: DecoderForCausalLM, num_tokens: int, skinny_on: bool) -> torch.Tensor:
    """Logits with the fused elementwise kernels on (interpreted), the skinny GEMMs on or off."""
    ids = torch.randint(0, VOCAB, (num_tokens,), generator=torch.Generator().manual_seed(1))
    previous = set_skinny_gemm(skinny_on)
    try:
        with fused_ops("on"), torch.no_grad(), \
                forward_context(cacheless_prefill_context([num_tokens], get_backend("torch"))):
            return model.compute_logits(model(ids, torch.arange(num_tokens)))
    finally:
        set_skinny_gemm(previous)


def test_every_projection_takes_the_fp8_skinny_gemm(calls: list[tuple[int, bool]]) -> None:
    model = fp8_model(seed=0)
    fast = forward(model, 5, skinny_on=True)
    assert calls == [(5, False), (5, False), (5, True), (5, False)] * LAYERS   # qkv, o, gate_up + SiLU, down
    calls.clear()
    reference = forward(model, 5, skinny_on=False)                           # the GEMMs in torch: W8A16, fp32
    assert calls == [(-5, False)] * 4 * LAYERS
    assert bool(torch.isfinite(fast).all())
    assert relative_error(fast, reference) < 2e-2                            # bf16 roundings of a layer's GEMMs


def test_more_than_16_rows_keep_the_block_gemm(calls: list[tuple[int, bool]]) -> None:
    mlp = fp8_model(seed=1).model.layers[0].mlp
    assert isinstance(mlp, GatedMLP)
    x = torch.randn(17, HIDDEN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with fused_ops("on"), torch.no_grad():
        out = mlp(x)
        assert calls == [(-17, False), (-17, False)]
        calls.clear()
        assert relative_error(mlp(x[:16]), out[:16]) < 2e-2                  # the kernel, at 16 rows
    assert calls == [(16, True), (16, False)]
