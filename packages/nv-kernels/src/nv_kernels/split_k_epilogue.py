"""The kernel side of split K, shared by the skinny GEMMs (bf16 / fp16, FP8 weights) and the INT4 GEMM: each split of
a column block stores its fp32 partial sums and bumps the block's arrival counter; the last split to arrive adds
every split's partials up in split order, finishes the tile with its kernel's own epilogue, stores it and puts the
counter back to 0. The buffers and that zero-on-entry invariant are split_k_workspace's.

A kernel calls the helper as one of its own jit helpers (imported into its module's globals, where Triton resolves
it); Triton inlines it, so the compiled kernel is the one written out in place.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters) or `tl`, which is None when
# triton is missing; the kernels that call this are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

from nv_kernels.fused_dispatch import triton_jit

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None


@triton_jit
def split_k_epilogue(acc, up, part_ptrs, out_ptrs, mask, COUNTERS, pid_n, pid_k, stride_ps, N, SPLIT_K,
                     finish: tl.constexpr, BIAS, OUT, cols, col_mask, GATED: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Store this split's partial sums; the last split of the column block to arrive reduces, finishes and stores.

    acc, up      fp32 [M_TILE, BLOCK_N] (M_TILE: the kernel's rows per tile, M_PAD or BLOCK_M): this split's sums of
                 the output columns (acc) and, GATED, of their up rows (up is not read otherwise)
    part_ptrs    fp32 pointers [M_TILE, BLOCK_N] into split 0 of the partial-sum workspace PART [SPLIT_K, M, N_w]
                 (N_w = 2 N when GATED: a column's up partial sits N elements to the right); split s is
                 s * stride_ps elements further on
    out_ptrs     pointers [M_TILE, BLOCK_N] into OUT [M, N]; mask bool [M_TILE, BLOCK_N]: the rows and columns that
                 exist (the masked-off partials are neither written nor read)
    COUNTERS     int32 pointer to the arrival counters [cdiv(N, BLOCK_N)], all 0 on entry and left 0; pid_n (int32)
                 this program's column block, pid_k (int32) its split, 0 .. SPLIT_K - 1
    stride_ps, N integers: elements between splits in PART; the output columns (the up half's offset)
    SPLIT_K      a constexpr (the reduction loop unrolled) or a run-time int32 (a loop)
    finish       constexpr: the kernel's epilogue, a jit function finish(acc, up, BIAS, OUT, cols, col_mask, N, GATED,
                 HAS_BIAS) -> the output tile [M_TILE, BLOCK_N] in OUT's dtype (bias, the rounding, SiLU-and-mul)
    BIAS, OUT    pointers as finish takes them; cols, col_mask the output columns and their mask, passed to finish
                 as given (in the shape it expects: [BLOCK_N] or [1, BLOCK_N])
    GATED, HAS_BIAS  constexpr bools, the kernel's variant
    Returns nothing: the last split stores the output tile, the others only their partials.
    """
    tl.store(part_ptrs + pid_k * stride_ps, acc, mask=mask)
    if GATED:
        tl.store(part_ptrs + pid_k * stride_ps + N, up, mask=mask)
    tl.debug_barrier()   # every thread's partial stores precede the release below
    arrived = tl.atomic_add(COUNTERS + pid_n, 1, sem="acq_rel")   # splits of this block done before
    if arrived == SPLIT_K - 1:   # the last one: the others' partials are visible (acquire)
        acc = tl.zeros(acc.shape, dtype=tl.float32)
        up = tl.zeros(acc.shape, dtype=tl.float32)
        for s in range(SPLIT_K):   # split order: the sum does not depend on which program came last
            # .cg: read L2, never a line of this buffer an earlier call left in this SM's L1
            acc += tl.load(part_ptrs + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
            if GATED:
                up += tl.load(part_ptrs + s * stride_ps + N, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptrs, finish(acc, up, BIAS, OUT, cols, col_mask, N, GATED, HAS_BIAS), mask=mask)
        tl.atomic_xchg(COUNTERS + pid_n, 0)                  # ready for the next call
