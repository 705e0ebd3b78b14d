"""The fused-kernel path of the layers and the model (what runs on CUDA) equals the torch path.

On CPU the fused kernels run in Triton's interpreter with nv_kernels' fused ops forced "on"; the
root conftest sets TRITON_INTERPRET=1 before anything imports triton when there is no GPU.
Covers RMSNorm (+ residual), SiluAndMul, RotaryEmbedding, and whole Qwen3 / Qwen2 forwards
(prefill, then decode) with a paged KV cache written by the fused q/k-norm + rotary + store kernel.
nv_llama's model is this decoder with qk_norm False, as Qwen2 here.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen3Config

from nv_kernels import fused_norm, fused_ops
from nv_kernels.torch_backend import TorchBackend
from nv_kernels.triton_backend import TritonBackend
from nv_layers import ForwardContext, RMSNorm, SiluAndMul, forward_context, get_rope
from nv_qwen3 import Qwen2ForCausalLM, Qwen3ForCausalLM

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available()
    or type(fused_norm._rms_norm_kernel).__name__ != "InterpretedFunction",
    reason="needs the Triton interpreter on a machine without a GPU (the GPU runs these in its own tests)")

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6)
BLOCK_SIZE, NUM_BLOCKS = 4, 16


def both_paths(fn: Any) -> tuple[Any, Any]:
    with fused_ops("on"):
        fused = fn()
    with fused_ops("off"):
        plain = fn()
    return fused, plain


def test_layers_match() -> None:
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(48, eps=1e-5)
    norm.weight.data = torch.rand(48, generator=gen) + 0.5
    x, res = torch.randn(5, 48, generator=gen), torch.randn(5, 48, generator=gen)
    fused, plain = both_paths(lambda: (norm(x), *norm(x, res)))
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(5, 2 * 40, generator=gen)
    fused, plain = both_paths(lambda: SiluAndMul()(gate_up))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    rope = get_rope(16, 8, 128, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    q, k = torch.randn(5, 3, 16, generator=gen), torch.randn(5, 48, generator=gen)
    positions = torch.tensor([0, 7, 31, 90, 127])
    fused, plain = both_paths(lambda: rope(positions, q, k))
    for a, b in zip(fused, plain, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def randomise_(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=gen) + 0.5)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def attach_caches(model: torch.nn.Module) -> list[torch.Tensor]:
    caches = []
    for layer in model.model.layers:
        attn = layer.self_attn.attn
        # [2, NB, BS, Hkv, D]
        kv = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim)
        attn.k_cache, attn.v_cache = kv[0], kv[1]
        caches.append(kv)
    return caches


class CountingBackend(TorchBackend):
    def __init__(self) -> None:
        self.stores = 0

    def store_kvcache(self, *args: Any) -> None:
        self.stores += 1
        super().store_kvcache(*args)


class CountingTritonBackend(TritonBackend):
    """The Triton backend (interpreted on CPU), counting the decodes that finished q and k themselves."""

    def __init__(self, rope_pays: bool | None = None) -> None:
        self.stores = 0
        self.rope_decodes = 0
        self.rope_pays = rope_pays    # None: the backend's own answer
        self.pays_asked: list[tuple] = []

    def decode_rope_pays(self, *args: Any) -> bool:
        self.pays_asked.append(args)
        return super().decode_rope_pays(*args) if self.rope_pays is None else self.rope_pays

    def store_kvcache(self, *args: Any, **kwargs: Any) -> None:
        self.stores += 1
        super().store_kvcache(*args, **kwargs)

    def decode_with_rope(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.rope_decodes += 1
        return super().decode_with_rope(*args, **kwargs)


def run_model(model_cls: type, config: Any, seed: int, backend: Any = None
              ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Prefill three sequences (5, 3 and 1 tokens; the last one's slot is -1, so its K/V are never
    stored and it attends to an empty page), then decode one token for the first two and a padded row
    (slot -1, length 0, as a CUDA graph's padding)."""
    model = model_cls(config)
    randomise_(model, seed)
    caches = attach_caches(model)
    backend = backend if backend is not None else CountingBackend()
    block_tables = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (9,), generator=gen)
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 0])
    slots = torch.tensor([0, 1, 2, 3, 4, 12, 13, 14, -1])                 # last row: skipped
    prefill = ForwardContext(is_decode=False, slot_mapping=slots,
                             seq_lens=torch.tensor([5, 3, 1], dtype=torch.int32), block_tables=block_tables,
                             cu_seqlens_q=torch.tensor([0, 5, 8, 9], dtype=torch.int32),
                             max_seqlen_q=5, max_seqlen_k=5, logits_indices=None, backend=backend)
    decode = ForwardContext(is_decode=True, slot_mapping=torch.tensor([5, 15, -1]),
                            seq_lens=torch.tensor([6, 4, 0], dtype=torch.int32), block_tables=block_tables,
                            cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=6, logits_indices=None, backend=backend)
    outputs = []
    with torch.no_grad():
        with forward_context(prefill):
            outputs.append(model(ids, positions))
        with forward_context(decode):
            outputs.append(model(torch.tensor([3, 7, 0]), torch.tensor([5, 3, 0]))[:2])   # the padded row: unused
    return outputs, caches, backend.stores


@pytest.mark.parametrize("model_cls,config", [
    (Qwen3ForCausalLM, Qwen3Config(**SHAPE)),
    (Qwen3ForCausalLM, Qwen3Config(**SHAPE, attention_bias=True, partial_rotary_factor=0.5)),
    (Qwen2ForCausalLM, Qwen2Config(**{k: v for k, v in SHAPE.items() if k != "head_dim"})),
    (Qwen2ForCausalLM, Qwen2Config(**{k: v for k, v in SHAPE.items() if k != "head_dim"},
                                   rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 32})),
])
def test_model_fused_equals_torch_path(model_cls: type, config: Any) -> None:
    (fused_out, fused_caches, fused_stores), (plain_out, plain_caches, plain_stores) = both_paths(
        lambda: run_model(model_cls, config, seed=1))
    assert fused_stores == 0                         # K/V went into the cache inside the fused kernel
    assert plain_stores == 2 * config.num_hidden_layers
    for a, b in zip(fused_out, plain_out, strict=True):
        assert bool(torch.isfinite(a).all())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(fused_caches, plain_caches, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_cls,config", [
    (Qwen3ForCausalLM, Qwen3Config(**SHAPE)),
    (Qwen2ForCausalLM, Qwen2Config(**{k: v for k, v in SHAPE.items() if k != "head_dim"})),
])
@pytest.mark.parametrize("rope_pays", [True, False])
def test_decode_finishing_rope_equals_torch_path(model_cls: type, config: Any, rope_pays: bool) -> None:
    """On the Triton backend a decode step's attention kernel norms and rotates q / k and stores the new K/V
    (nv_kernels.decode_rope) where the backend says that pays: the same logits and cache as the torch path, and
    no separate store. Where it does not pay, the decoder runs the separate norm + rotary + store kernel and a
    plain decode: the same results again. (The backend's own answer here would be no: one split for a
    6-token context.)"""
    backend = CountingTritonBackend(rope_pays)
    with fused_ops("on"):
        fused_out, fused_caches, _ = run_model(model_cls, config, seed=2, backend=backend)
    with fused_ops("off"):
        plain_out, plain_caches, _ = run_model(model_cls, config, seed=2)
    layers = config.num_hidden_layers
    assert backend.rope_decodes == (layers if rope_pays else 0) and backend.stores == 0
    for a, b in zip(fused_out, plain_out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(fused_caches, plain_caches, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_the_decoder_tells_the_backend_whether_its_cache_is_fp8(cache_dtype: torch.dtype) -> None:
    """An FP8 cache splits its decode differently (decode_tuning), and the fused decode pays where it splits: the
    decoder asks the backend with its cache's kind."""
    config = Qwen3Config(**SHAPE)
    model = Qwen3ForCausalLM(config)
    for layer in model.model.layers:
        attn = layer.self_attn.attn
        attn.k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim).to(cache_dtype)
        attn.v_cache = attn.k_cache.clone()
    backend = CountingTritonBackend(rope_pays=False)
    decode = ForwardContext(is_decode=True, slot_mapping=torch.tensor([5]),
                            seq_lens=torch.tensor([6], dtype=torch.int32),
                            block_tables=torch.tensor([[0, 1, 2]], dtype=torch.int32), cu_seqlens_q=None,
                            max_seqlen_q=1, max_seqlen_k=4096, logits_indices=None, backend=backend)
    layer = model.model.layers[0].self_attn
    assert layer._decode_finishes_rope(decode, 1, torch.device("cpu")) is False
    assert backend.pays_asked == [(1, layer.num_kv_heads, 4096, torch.device("cpu"), cache_dtype != torch.float32)]
