"""Fused Gumbel-max draw for the sampler on CUDA: one pass over [S, V] scores.

The torch path of nv_layers.sampler builds the same noise with ~20 elementwise int64 passes over
[S, V] (about 270 bytes of memory traffic per element, ~2.5 ms at S=256, V=151,936 on an H200); this
kernel reads each score once and keeps a running argmax per lane. The hash is bit-identical to the
torch path (uint32 arithmetic wraps mod 2**32, the torch path masks to 32 bits); only `log` may
differ in the last ulp between the two, so a near-tie can rarely pick the other token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nv_layers import sampler as _ref

assert _ref._MUL1 < 2**31 and _ref._MUL2 < 2**31  # literals stay int32 in Triton


@triton.jit
def _mix32(x):
    # x: uint32. Same finaliser as nv_layers.sampler._mix32_.
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x31848BAB
    x ^= x >> 16
    return x


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min2(a, b):
    return tl.minimum(a, b)


# Only builtins and our own jit helpers inside the kernel: triton.language's @jit helpers
# (tl.zeros, tl.max, ...) cannot run under TRITON_INTERPRET=1 once triton was imported without it.
@triton.jit
def _gumbel_argmax_kernel(scores_ptr, stride_s, row_keys_ptr, tok_keys_ptr, out_ptr, vocab,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    key = tl.load(row_keys_ptr + row).to(tl.uint32)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < vocab
        score = tl.load(scores_ptr + row * stride_s + offs, mask=mask, other=float("-inf"))
        tok = tl.load(tok_keys_ptr + offs, mask=mask, other=0).to(tl.uint32)
        bits = _mix32(tok ^ key)
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # (0, 1), as uniform_from_bits
        val = score - tl.log(-tl.log(u))
        better = mask & (val > best_val)  # strict: the first index wins within a lane
        best_val = tl.where(better, val, best_val)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.reduce(best_val, 0, _max2)
    # Smallest index among the lanes holding the maximum (torch.argmax's first occurrence).
    idx = tl.reduce(tl.where(best_val == top, best_idx, vocab), 0, _min2)
    tl.store(out_ptr + row, idx.to(tl.int64))


def gumbel_argmax(scores: torch.Tensor, row_keys: torch.Tensor, tok_keys: torch.Tensor,
                  block: int = 2048) -> torch.Tensor:
    """argmax(scores + Gumbel(hash(row key, token key))) per row: [S, V] float32 -> [S] int64."""
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    num_rows, vocab = scores.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=scores.device)
    if num_rows:
        _gumbel_argmax_kernel[(num_rows,)](scores, scores.stride(0), row_keys.contiguous(),
                                           tok_keys, out, vocab, BLOCK=block)
    return out
