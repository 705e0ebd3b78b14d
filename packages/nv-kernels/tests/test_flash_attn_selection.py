"""Which flash-attn build "flash_attn" runs, the per-phase default, and the arguments the FlashAttention-4
backend passes (CPU: fake `flash_attn` modules stand in for the real packages)."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from nv_kernels import registry
from nv_kernels.interface import AttentionBackend, WarmsUp
from nv_kernels.testing import dense_causal_attention, random_paged_batch, relative_error
from nv_kernels.torch_backend import TorchBackend

HOPPER, AMPERE = (9, 0), (8, 0)


class FakeFlashAttn4:
    """flash_attn.cute.flash_attn_varlen_func with FA4's paged semantics (keys of row b: the first
    seqused_k[b] tokens of pages page_table[b]; causal aligned to the end), recording every call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, None]:
        self.calls.append(dict(kw, q=q, k=k, v=v))
        for name in ("cu_seqlens_q", "seqused_k", "page_table"):
            if kw[name] is not None:
                assert kw[name].dtype == torch.int32 and kw[name].stride(-1) == 1, name
        table, used, cu = kw["page_table"], kw["seqused_k"], kw["cu_seqlens_q"]
        assert table.dim() == 2 and table.shape[0] == used.shape[0]
        assert k.shape[1] * table.shape[1] >= int(used.max()), "the page table must cover every context"
        rows = q.reshape(-1, q.shape[-2], q.shape[-1])  # [T, Hq, D]
        bounds = cu.tolist() if cu is not None else list(range(0, q.shape[0] * q.shape[1] + 1, q.shape[1]))
        out = torch.zeros_like(rows)
        for b in range(table.shape[0]):
            length = int(used[b])
            lo, hi = bounds[b], bounds[b + 1]
            if length == 0 or hi == lo:
                continue
            keys = k[table[b].long()].reshape(-1, k.shape[2], k.shape[3])[:length]
            values = v[table[b].long()].reshape(-1, v.shape[2], v.shape[3])[:length]
            assert kw["causal"] or hi - lo == 1
            out[lo:hi] = dense_causal_attention(rows[lo:hi], keys, values, kw["softmax_scale"]).to(q.dtype)
        return out.view(q.shape), None


class FakeFlashAttn2:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def flash_attn_varlen_func(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append(("varlen", kw))
        return torch.zeros_like(q)

    def flash_attn_with_kvcache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append(("kvcache", kw))
        return torch.zeros_like(q)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    """A fake GPU of a chosen compute capability, no flash-attn installed, and fresh backend instances."""
    capability = {"value": HOPPER}
    monkeypatch.setattr(registry, "_cuda_capability", lambda device: capability["value"])
    monkeypatch.setattr(registry, "_instances", {})
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("nv_kernels.flash_attn_backend", "nv_kernels.flash_attn4_backend"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # None: `import flash_attn` raises ImportError
    return capability


def install_fa4(monkeypatch: pytest.MonkeyPatch) -> FakeFlashAttn4:
    fake = FakeFlashAttn4()
    package = ModuleType("flash_attn")  # FA4 alone: a namespace package without flash-attn 2's API
    package.__path__ = []
    cute = ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return fake


def install_fa2(monkeypatch: pytest.MonkeyPatch) -> FakeFlashAttn2:
    fake = FakeFlashAttn2()
    package = sys.modules.get("flash_attn") or ModuleType("flash_attn")
    package.flash_attn_varlen_func = fake.flash_attn_varlen_func  # type: ignore[attr-defined]
    package.flash_attn_with_kvcache = fake.flash_attn_with_kvcache  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    return fake


def test_without_flash_attn_the_error_names_the_extra(gpu) -> None:
    with pytest.raises(ValueError, match=r"'flash_attn' is unavailable: .*pip install 'nv-kernels\[flash-attn\]'"):
        registry.get_backend("flash_attn", "cuda")
    assert registry.get_backend(None, "cuda").name == "triton"  # the default falls back


def test_the_named_extra_installs_flash_attention_4() -> None:
    pyproject = Path(registry.__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["flash-attn"]
    assert registry.FLASH_ATTN_EXTRA == "pip install 'nv-kernels[flash-attn]'"
    assert any(req.startswith("flash-attn-4==") for req in extra)


def test_fa4_on_an_older_gpu_is_refused_with_the_reason(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fa4(monkeypatch)
    gpu["value"] = AMPERE
    with pytest.raises(ValueError, match=r"Hopper or Blackwell GPU .* this one is 8\.0"):
        registry.get_backend("flash_attn", "cuda")


def test_fa4_is_picked_on_hopper_even_next_to_flash_attn_2(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels.flash_attn4_backend import FlashAttn4Backend

    install_fa4(monkeypatch)
    install_fa2(monkeypatch)
    backend = registry.get_backend("flash_attn", "cuda")
    assert isinstance(backend, FlashAttn4Backend) and isinstance(backend, AttentionBackend)
    assert isinstance(backend, WarmsUp) and backend.name == "flash_attn"
    assert registry.get_backend("flash_attn", "cuda") is backend


def test_flash_attn_2_is_picked_where_fa4_cannot_run(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fa4(monkeypatch)
    fake = install_fa2(monkeypatch)
    gpu["value"] = AMPERE
    backend = registry.get_backend("flash_attn", "cuda")
    assert type(backend).__name__ == "FlashAttnBackend"
    q = torch.zeros(3, 4, 8)
    cache = torch.zeros(5, 16, 2, 8)
    backend.decode(q, cache, cache, seq_lens=torch.tensor([1, 2, 3], dtype=torch.int32),
                   block_tables=torch.zeros(3, 1, dtype=torch.int32), max_seqlen_k=3, scale=0.5)
    kind, kw = fake.calls[-1]
    assert kind == "kvcache" and kw["softmax_scale"] == 0.5 and kw["block_table"].shape == (3, 1)


def _batch(dtype: torch.dtype, block_size: int, q_lens: list[int], seq_lens: list[int]):
    return random_paged_batch(seq_lens, q_lens, num_q_heads=4, num_kv_heads=2, head_dim=16,
                              block_size=block_size, num_blocks=64, dtype=dtype, seed=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fa4_prefill_arguments_and_result(gpu, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    fake = install_fa4(monkeypatch)
    backend = registry.get_backend("flash_attn", "cuda")
    # fresh prompts, a cached prefix, a one-token row (a decode inside a mixed step)
    b = _batch(dtype, 16, q_lens=[5, 3, 1, 20], seq_lens=[5, 40, 17, 20])
    tables64 = b.block_tables.long()  # int64 tables become int32 for the kernel
    kw = dict(cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, max_seqlen_q=b.max_seqlen_q,
              max_seqlen_k=b.max_seqlen_k, scale=0.25)
    out = backend.prefill(b.q, b.k_cache, b.v_cache, block_tables=tables64, **kw)
    call = fake.calls[-1]
    assert call["q"].shape == (29, 4, 16) and call["k"] is b.k_cache and call["v"] is b.v_cache
    assert call["page_table"].dtype == torch.int32 and call["page_table"].shape == b.block_tables.shape
    assert torch.equal(call["page_table"], b.block_tables)
    assert torch.equal(call["seqused_k"], b.seq_lens) and torch.equal(call["cu_seqlens_q"], b.cu_seqlens_q)
    assert call["causal"] is True and call["softmax_scale"] == 0.25 and call["num_splits"] == 1
    assert call["max_seqlen_q"] == 20 and call["max_seqlen_k"] == 40
    ref = TorchBackend().prefill(b.q, b.k_cache, b.v_cache, block_tables=b.block_tables, **kw)
    assert out.shape == b.q.shape and relative_error(out, ref) < 1e-2


def test_fa4_decode_arguments_and_result(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fa4(monkeypatch)
    backend = registry.get_backend("flash_attn", "cuda")
    seq_lens = [1, 16, 17, 33, 50]
    b = _batch(torch.bfloat16, 16, q_lens=[1] * 5, seq_lens=seq_lens)
    lens = b.seq_lens.clone()
    lens[1] = 0  # a CUDA-graph padding row
    out = backend.decode(b.q, b.k_cache, b.v_cache, seq_lens=lens, block_tables=b.block_tables,
                         max_seqlen_k=64, scale=0.25)
    call = fake.calls[-1]
    assert call["q"].shape == (5, 1, 4, 16) and call["cu_seqlens_q"] is None and call["max_seqlen_q"] == 1
    assert torch.equal(call["seqused_k"], lens) and call["page_table"].shape == (5, 4)
    assert call["max_seqlen_k"] == 64 and call["num_splits"] == 1 and call["softmax_scale"] == 0.25
    ref = TorchBackend().decode(b.q, b.k_cache, b.v_cache, seq_lens=lens, block_tables=b.block_tables,
                                max_seqlen_k=64, scale=0.25)
    live = lens > 0
    assert out.shape == b.q.shape and relative_error(out[live], ref[live]) < 1e-2


def test_fa4_warms_up_every_variant_once_per_cache_shape(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fa4(monkeypatch)
    backend = registry.get_backend("flash_attn", "cuda")
    b = _batch(torch.bfloat16, 16, q_lens=[1, 1], seq_lens=[3, 9])

    def decode() -> None:
        backend.decode(b.q, b.k_cache, b.v_cache, seq_lens=b.seq_lens, block_tables=b.block_tables,
                       max_seqlen_k=16, scale=0.25)

    decode()
    warm, real = fake.calls[:-1], fake.calls[-1]
    prefill_q_lens = sorted(c["max_seqlen_q"] for c in warm if c["cu_seqlens_q"] is not None)
    group = 4 // 2
    assert prefill_q_lens[0] * group <= 128 < prefill_q_lens[-1] * group  # both query-tile variants
    assert any(c["cu_seqlens_q"] is None for c in warm)  # and the decode variant
    assert real["q"].shape == (2, 1, 4, 16)
    decode()
    assert len(fake.calls) == len(warm) + 2  # no second warm-up for the same cache
    with pytest.raises(ValueError, match="float16/bfloat16"):
        backend.decode(b.q.float(), b.k_cache.float(), b.v_cache.float(), seq_lens=b.seq_lens,
                       block_tables=b.block_tables, max_seqlen_k=16, scale=0.25)


def test_per_phase_default_table(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    from nv_kernels.flash_attn4_backend import FlashAttn4Backend
    from nv_kernels.phase_split_backend import PhaseSplitBackend

    fake = install_fa4(monkeypatch)
    monkeypatch.setattr(registry, "FASTEST_ON_CUDA", {"prefill": ("flash_attn",), "decode": ("triton",)})
    backend = registry.get_backend(None, "cuda")
    assert isinstance(backend, PhaseSplitBackend) and isinstance(backend, AttentionBackend)
    assert isinstance(backend.prefill_backend, FlashAttn4Backend)
    assert backend.decode_backend.name == "triton"
    assert backend.name == "prefill:flash_attn,decode:triton"
    assert registry.get_backend(None, "cuda") is backend
    # the engine's start decodes (through triton) before any prefill: FA4's prefill compiles then
    b = _batch(torch.float32, 16, q_lens=[1, 1], seq_lens=[3, 9])
    decode = backend.decode_backend
    monkeypatch.setattr(decode, "decode", lambda q, *a, **kw: torch.zeros_like(q))
    backend.decode(b.q.bfloat16(), b.k_cache.bfloat16(), b.v_cache.bfloat16(), seq_lens=b.seq_lens,
                   block_tables=b.block_tables, max_seqlen_k=16, scale=0.25)
    assert any(c["cu_seqlens_q"] is not None for c in fake.calls)
    # a phase whose first choice is unavailable falls back to triton
    monkeypatch.setattr(registry, "FASTEST_ON_CUDA", {"prefill": ("flash_attn",), "decode": ("flash_attn",)})
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    assert registry.get_backend(None, "cuda").name == "triton"
    assert registry.fastest_for_phase("decode", "cpu") == "torch"
