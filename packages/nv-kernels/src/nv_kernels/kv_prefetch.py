"""L2 prefetch of a decode split's KV cache lines, for the split kernel launched early by dependent launch
(nv_kernels.dependent_launch): while the previous kernel still runs, the split asks L2 for the K and V rows
of its first tokens, so its tile loads after the wait hit L2 instead of HBM.

What it reads before the wait (the sequence's length and block-table row) is staged before the step's first
kernel and never written by a kernel of the step; the new token's slot, which the split kernel itself
writes, is prefetched like any other line (L2 is coherent: the store lands there after). A prefetch never
faults or changes a result: addresses are clamped into the sequence's pages.

NV_DECODE_PREFETCH=0 turns it off (A/B runs).
"""
# Triton kernels: pyright cannot type @triton.jit calls or `tl`; the kernel is checked by the decode tests.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import os

import triton
import triton.language as tl

PREFETCH_TOKENS = 64 if os.environ.get("NV_DECODE_PREFETCH", "1") != "0" else 0   # per split; 0: off
LINE_BYTES = 128


def prefetch_lines_per_row(head_dim: int, element_size: int, token_major_v: bool) -> int:
    """128-byte lines of one token's row of one KV head; 0 (no prefetch) when the prefetch is off or V is
    token-major (its rows are not contiguous per token)."""
    if not PREFETCH_TOKENS or token_major_v:
        return 0
    return max(1, head_dim * element_size // LINE_BYTES)


@triton.jit
def prefetch_split_kv(K, V, table_row, seq_len, split, kv_head, stride_cb, stride_cs, stride_ch,
                      stride_vb, stride_vs, stride_vh, stride_vd, NUM_SPLITS: tl.constexpr, TILE: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr, LINES: tl.constexpr,
                      LINE_ELEMENTS: tl.constexpr):
    """Ask L2 for the K and V rows (LINES lines each) of the first TOKENS tokens of this split of a sequence
    of seq_len tokens (the split kernel's partition: cdiv(cdiv(seq_len, NUM_SPLITS), TILE) * TILE each)."""
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE) * TILE
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    if end > start:
        n = tl.minimum(start + tl.arange(0, TOKENS), end - 1)                     # [T] clamped into the split
        page = tl.maximum(tl.load(table_row + n // BLOCK_SIZE), 0).to(tl.int64)   # [T]
        slot = n % BLOCK_SIZE
        line = tl.arange(0, LINES) * LINE_ELEMENTS                                  # [L] first element of a line
        k_ptrs = K + page[:, None] * stride_cb + slot[:, None] * stride_cs + kv_head * stride_ch + line[None, :]
        v_ptrs = (V + page[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                  + line[None, :] * stride_vd)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [k_ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [v_ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)

