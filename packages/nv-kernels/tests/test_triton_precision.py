"""bf16 precision of the Triton attention kernels, on CPU under TRITON_INTERPRET=1.

Triton's interpreter does not model bf16 the way the GPU does: it truncates fp32 -> bf16 casts and
multiplies bf16 dot operands as raw integers. The `gpu_like_bf16` fixture patches those two
interpreter operations to the GPU's semantics (round-to-nearest-even casts, bf16 operands multiplied
exactly and summed in fp32, as tensor cores do), so the kernels' bf16 rounding can be measured here.

Checks against a float64 reference, at Qwen3-like heads (D 128, GQA 2) and contexts up to 1,100:
- the bf16 outputs are within 1.3x the error of torch's bf16 scaled_dot_product_attention;
- before the final bf16 rounding (outputs allocated in fp32), within 1.3x a flash-attention-style
  emulation (fp32 scores, P rounded to bf16 for P @ V, fp32 accumulation): catches any extra
  rounding inside the kernels (bf16 split-KV partials, Q pre-scaled in bf16, bf16 accumulators).
"""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nv_kernels.testing import dense_causal_attention, random_paged_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
HQ, HKV, D = 4, 2, 128
SCALE = D ** -0.5
RATIO, EPS = 1.3, 1e-4


@pytest.fixture(scope="module")
def kernels() -> Iterator[dict[str, ModuleType]]:
    from triton.runtime import interpreter

    with pytest.MonkeyPatch.context() as mp:
        if "nv_kernels.triton_decode" not in sys.modules:
            mp.setenv("TRITON_INTERPRET", "1")
        import nv_kernels.triton_decode as decode
        import nv_kernels.triton_prefill as prefill

        if not isinstance(decode._decode_split_kernel, interpreter.InterpretedFunction):
            pytest.skip("triton kernels were already compiled for the GPU in this process")
        yield {"decode": decode, "prefill": prefill}


@pytest.fixture()
def gpu_like_bf16(kernels: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    if not (hasattr(builder, "cast_impl") and hasattr(builder, "create_dot")):
        pytest.skip("this triton's interpreter has no cast_impl / create_dot to patch")
    cast_impl, create_dot = builder.cast_impl, builder.create_dot

    def to_f32(bits: np.ndarray) -> np.ndarray:  # bf16 bit patterns (uint16) -> float32
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)

    def to_bf16(values: np.ndarray) -> np.ndarray:  # float32 -> bf16 bits, round to nearest even
        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16)

    def gpu_cast(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            return interp.TensorHandle(to_f32(src.data), tl.float32)
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interp.TensorHandle(to_bf16(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    def gpu_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if a.dtype.scalar == tl.bfloat16:
            a = interp.TensorHandle(to_f32(a.data), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = interp.TensorHandle(to_f32(b.data), tl.float32)
        return create_dot(self, a, b, d, *args)

    monkeypatch.setattr(builder, "cast_impl", gpu_cast)
    monkeypatch.setattr(builder, "create_dot", gpu_dot)


def torch_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's bf16 SDPA: q [Q, Hq, D] at the last Q positions of k/v [L, Hkv, D] -> [Q, Hq, D]."""
    nq, length = q.shape[0], k.shape[0]
    kh = k.transpose(0, 1).repeat_interleave(HQ // HKV, dim=0)  # [Hq, L, D]
    vh = v.transpose(0, 1).repeat_interleave(HQ // HKV, dim=0)
    mask = torch.arange(length)[None, :] <= torch.arange(length - nq, length)[:, None]  # [Q, L]
    return F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, attn_mask=mask,
                                          scale=SCALE).transpose(0, 1)


def flash_style(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 scores of bf16 inputs, P rounded to bf16 for P @ V, fp32 sums and output."""
    nq, length = q.shape[0], k.shape[0]
    kh = k.float().repeat_interleave(HQ // HKV, dim=1)  # [L, Hq, D]
    vh = v.float().repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q.float(), kh) * SCALE  # [Hq, Q, L]
    mask = torch.arange(length)[None, :] <= torch.arange(length - nq, length)[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.einsum("hql,lhd->qhd", p.bfloat16().float() / p.sum(-1, keepdim=True), vh)


GPU_TILES = dict(block_m=128, tile_n=32)  # the prefill tile shapes used on the GPU at D 128
CASES = [  # kind, context lengths, query lengths, kernel keywords
    ("decode", [17, 300, 1100], [1, 1, 1], dict(num_splits=4, tile=32)),  # split-KV + merge
    ("decode", [700, 1100], [1, 1], dict(num_splits=1, tile=16)),
    ("prefill", [300, 40], [300, 40], GPU_TILES),
    ("prefill", [1000], [64], GPU_TILES),  # the last 64 queries after a cached prefix
]


def run_case(kernels: dict, kind: str, seq_lens: list[int], q_lens: list[int], kw: dict) -> list:
    """Per sequence (q, k, v, kernel output); q doubled for peakier attention rows."""
    b = random_paged_batch(seq_lens, q_lens, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                           block_size=16, dtype=torch.bfloat16, seed=len(seq_lens))
    q = (b.q.float() * 2.0).to(torch.bfloat16)
    if kind == "decode":
        out = kernels["decode"].decode_attention(q, b.k_cache, b.v_cache, b.seq_lens,
                                                 b.block_tables, max(seq_lens), SCALE, **kw)
    else:
        out = kernels["prefill"].prefill_attention(q, b.k_cache, b.v_cache, b.cu_seqlens_q,
                                                   b.seq_lens, b.block_tables, max(q_lens), SCALE,
                                                   **kw)
    cu = b.cu_seqlens_q.tolist()
    return [(q[cu[i]:cu[i + 1]], b.keys[i], b.values[i], out[cu[i]:cu[i + 1]])
            for i in range(len(seq_lens))]


def errors(parts: list, other) -> tuple[float, float]:
    """(our, other's) relative error against float64 over all sequences of the case."""
    ours = theirs = norm = 0.0
    for q, k, v, out in parts:
        ref = dense_causal_attention(q, k, v, SCALE)
        ours += float((out.double() - ref).norm() ** 2)
        theirs += float((other(q, k, v).double() - ref).norm() ** 2)
        norm += float(ref.norm() ** 2)
    return (ours / norm) ** 0.5, (theirs / norm) ** 0.5


@pytest.mark.parametrize("kind,seq_lens,q_lens,kw", CASES)
def test_bf16_error_within_torch_bf16_and_flash_attention(
        kernels: dict, gpu_like_bf16: None, monkeypatch: pytest.MonkeyPatch, kind: str,
        seq_lens: list[int], q_lens: list[int], kw: dict) -> None:
    def fp32_outputs(shape: Any, dtype: Any = None, device: Any = None) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=torch.float32, device=device)

    # One run with fp32 outputs: the kernels' bf16 store is the round-to-nearest of the same values.
    monkeypatch.setattr(kernels["decode"], "_empty", fp32_outputs)
    parts = run_case(kernels, kind, seq_lens, q_lens, kw)
    assert parts[0][3].dtype == torch.float32
    ours, theirs = errors(parts, flash_style)  # no rounding beyond flash attention's P in bf16
    assert ours <= RATIO * theirs + 1e-5, ("before the output rounding", ours, theirs)
    rounded = [(q, k, v, out.to(torch.bfloat16)) for q, k, v, out in parts]
    ours, theirs = errors(rounded, torch_bf16)
    assert ours <= RATIO * theirs + EPS, ("bf16 outputs vs torch bf16 SDPA", ours, theirs)
