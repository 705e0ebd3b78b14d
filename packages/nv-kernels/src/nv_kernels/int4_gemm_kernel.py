"""The Triton kernel of nv_kernels.int4_gemm: y[M, N] = x[M, K] @ dequant(W)^T, W4A16 with per-group scales and zeros.

Layout (nv's, made once at load by int4_gemm.pack_int4_weight from any checkpoint format):
  qweight int32 [N, K / 8]   per output row, 16 words per group of 128 inputs; word j of group g holds the codes
                             of k = 128 g + 16 i + j at bits 4 i .. 4 i + 3, i = 0..7. So the nibbles at one shift
                             of a group's 16 words are 16 consecutive inputs: x is read as contiguous 16-element
                             slices and no code changes place in registers (interleaving within a group, as
                             GPU-oriented INT4 formats do, in its simplest form)
  scales  [K / 128, N]       float16 / bfloat16 / float32, one per (group of 128 inputs, output column)
  zeros   uint8 [K / 128, N] the group's zero point (0..16: an older GPTQ checkpoint's stored zero + 1 may be 16)
W[n, k] = (code[n, k] - zero[k // 128, n]) * scale[k // 128, n]. One K step is one group (16 words per row), so a
step needs one scale and one zero per column and no K masks (K is a multiple of 128). Within a step the kernel sums
x * (code - zero) (an integer from -16 to 15: exact in any float dtype) and scales the group's sum once.

Variants (constexpr):
  USE_DOT   x [BLOCK_M, 16] slices times (code - zero) [BLOCK_N, 16] on the tensor cores, eight per group (x's
            dtype, exact operands, fp32 sums); else (one row, M == 1) the GEMV on the CUDA cores: products in fp32
            per [BLOCK_N, 16] lane, reduced once after the K loop.
  PAIRS     up to 16 rows (decode): the weight tile is the MMA's first operand and x^T [128, BLOCK_M] its second,
            one dot per group of 128 inputs, so the tensor cores' rows are the output columns and only x's few rows
            are padding. Codes become 16-bit floats two at a time (see below), exactly, in x's dtype (bf16 / fp16).
  SPLIT     the K groups cut over SPLIT_K programs per column block (decode shapes with few column blocks; SPLIT_K
            is a run-time argument, so the split counts of different shapes share one compiled variant):
            each writes fp32 partial sums to a workspace and bumps the block's arrival counter; the last to
            arrive adds the partials up in split order and writes the output (the scheme of nv_kernels.skinny_gemm:
            counters back to 0 after every call, so no fill per call and CUDA-graph safe).
  GATED     the gate_up projection of a SwiGLU MLP with SiLU-and-mul in the epilogue (as nv_kernels.skinny_gemm's
            GATED): the weight holds [gate; up] (2 N rows, as MergedColumnParallelLinear stores them), a program
            streams the gate rows and the up rows of its columns and writes silu(gate) * up [M, N].
  HAS_BIAS  y += bias before the rounding to the output dtype.
  DOT_IN_FP32  Triton's interpreter computes tl.dot of bf16 tiles wrongly (numpy has no bf16): there both tiles
            are fp32.
  USE_PDL   programmatic dependent launch at one row (nv_kernels.dependent_launch): the grid starts while the
            previous kernel finishes and waits for it before anything else.
A code becomes a float without an int-to-float conversion (a slow instruction on the GPU): OR-ing it into the
mantissa of 2^23 (0x4B000000) gives the float 2^23 + code, and subtracting 2^23 + zero leaves code - zero exactly
(the magic-number trick of FasterTransformer's INT4 dequantizers). The nibble need not be shifted down first: in
place at bits 4 E (E <= 4, below the exponent) it gives 2^23 + code * 16^E, and one fma with 16^-E and
-(2^23 * 16^-E + zero) leaves code - zero, exactly again; nibbles 5..7 are masked in place in the word shifted
by 12. So a code costs one logic op (mask and OR) and one fma: decode is bound by the integer pipe otherwise.
PAIRS does the same in 16 bits, two codes per instruction: the word shifted by 4 P, masked with 0x000F000F, holds
nibbles P and P + 4 (inputs 16 P + j and 16 P + 64 + j of word j) at bits 0 and 16; OR-ing in the 16-bit float
128 (bf16 0x4300; fp16 1024, 0x6400) twice makes the pair of floats 128 + code, exact, and one packed fma subtracts
128 + zero from both. The pair stays in its register as two neighbouring inputs of the MMA's first operand: a
group's tile [BLOCK_N, 128] orders its inputs as column c = 32 P + 2 j + h <-> input 16 P + 64 h + j, and x^T is
read in that order, so no code moves between registers (2.5-2.8 instructions per code on sm_90 at BLOCK_N 128,
against 6.7 for the GEMV on the CUDA cores).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
# pyright: reportAttributeAccessIssue=false
# (that last one: tl.extra.cuda, which triton exposes at run time only)
from __future__ import annotations

from nv_kernels.fused_dispatch import triton_jit
from nv_kernels.split_k_epilogue import split_k_epilogue

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

GROUP = 128               # inputs per scale / zero: one K step
WORDS = GROUP // 8        # int32 words per row per group
# PAIRS: a word (shifted) -> two 16-bit floats B + code (mask and OR in one lop3: older ptxas leaves `& |` written in
# Triton as two instructions), minus B + zero ($3: that float negated, in both halves) in one packed fma. B: bf16 128
# (0x4300; 7 mantissa bits hold the code exactly), fp16 1024 (0x6400).
_PAIR_ASM = ("{.reg .b32 t, one; mov.b32 one, %s; lop3.b32 t, $2, 0x000F000F, %s, 0xEA; fma.rn.%s t, t, one, $3; "
             "mov.b32 {$0, $1}, t;}")
if tl is not None:
    PAIR_ASM_BF16 = tl.constexpr(_PAIR_ASM % ("0x3F803F80", "0x43004300", "bf16x2"))
    PAIR_ASM_F16 = tl.constexpr(_PAIR_ASM % ("0x3C003C00", "0x64006400", "f16x2"))
    NEG_BIAS_BF16 = tl.constexpr(0xC300)       # -128.0 in bf16; + zero: -(128 + zero)
    NEG_BIAS_F16 = tl.constexpr(0xE400)        # -1024.0 in fp16


@triton_jit
def _codes_minus_zero(words, words_hi, zero, SLAB: tl.constexpr):
    """The nibbles at bits 4 SLAB of words [BLOCK_N, 16] -> code - zero in fp32, exactly; zero [BLOCK_N] fp32,
    words_hi = words >> 12. Nibbles 0..4 are masked in place (bits 4 E, E = SLAB), nibbles 5..7 in words_hi
    (E = SLAB - 3), so no nibble needs a shift of its own: the float 2^23 + code * 16^E times 16^-E, minus
    2^23 * 16^-E + zero, in one fma (the product is exact, so is the sum)."""
    E = SLAB if SLAB <= 4 else SLAB - 3
    src = words if SLAB <= 4 else words_hi
    biased = ((src & (0xF << (4 * E))) | 0x4B000000).to(tl.float32, bitcast=True)   # 2^23 + code * 16^E
    inv = 1.0 / (1 << (4 * E))
    return tl.fma(biased, inv, -(8388608.0 * inv) - zero[:, None])


@triton_jit
def _code_pairs(words, zero, P: tl.constexpr, X_DTYPE: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """The nibbles P and P + 4 of words [BLOCK_N, 16] minus zero [BLOCK_N, 1] (int32) -> (lo, hi) [BLOCK_N, 16]:
    code - zero of inputs 16 P + j (lo) and 16 P + 64 + j (hi), exact, in X_DTYPE (bf16 / fp16); fp32 where
    DOT_IN_FP32 (the interpreter, which runs no PTX)."""
    if DOT_IN_FP32:
        lo = (((words >> (4 * P)) & 0xF) - zero).to(tl.float32)
        hi = (((words >> (4 * P + 16)) & 0xF) - zero).to(tl.float32)
    else:
        neg = zero + (NEG_BIAS_BF16 if X_DTYPE == tl.bfloat16 else NEG_BIAS_F16)   # the 16-bit float -(B + zero)
        lo, hi = tl.inline_asm_elementwise(PAIR_ASM_BF16 if X_DTYPE == tl.bfloat16 else PAIR_ASM_F16, "=h,=h,r,r",
                                           [words >> (4 * P), neg | (neg << 16)], dtype=(tl.int16, tl.int16),
                                           is_pure=True, pack=1)
        lo = lo.to(X_DTYPE, bitcast=True)
        hi = hi.to(X_DTYPE, bitcast=True)
    return lo, hi


@triton_jit
def _pair_sums(QW, SCALES, ZEROS, w_ptrs, x_tile, rn, n_mask, g, stride_sg, BLOCK_N: tl.constexpr,
               DOT_IN_FP32: tl.constexpr):
    """PAIRS: group g's sums, scaled, [BLOCK_N, BLOCK_M] fp32; x_tile [128, BLOCK_M]: x^T's group g in the tile's
    input order (column c = 32 P + 2 j + h of the weight tile <-> input 16 P + 64 h + j)."""
    words = tl.load(w_ptrs + g * 16, mask=n_mask[:, None], other=0)                  # [BLOCK_N, 16] int32
    scale = tl.load(SCALES + g * stride_sg + rn, mask=n_mask, other=0.0).to(tl.float32)            # [BLOCK_N]
    zero = tl.load(ZEROS + g * stride_sg + rn, mask=n_mask, other=0).to(tl.int32)[:, None]         # [BLOCK_N, 1]
    l0, h0 = _code_pairs(words, zero, 0, x_tile.dtype, DOT_IN_FP32)
    l1, h1 = _code_pairs(words, zero, 1, x_tile.dtype, DOT_IN_FP32)
    l2, h2 = _code_pairs(words, zero, 2, x_tile.dtype, DOT_IN_FP32)
    l3, h3 = _code_pairs(words, zero, 3, x_tile.dtype, DOT_IN_FP32)
    # [BLOCK_N, 16 (j), 2 (h), 2 (P % 2), 2 (P // 2)] -> [BLOCK_N, P // 2, P % 2, j, h]: the pairs (h) innermost
    tile = tl.join(tl.join(tl.join(l0, h0), tl.join(l1, h1)), tl.join(tl.join(l2, h2), tl.join(l3, h3)))
    w = tl.permute(tile, (0, 4, 3, 1, 2)).reshape(BLOCK_N, 128)
    return tl.dot(w, x_tile) * scale[:, None]


@triton_jit
def _group_sums(QW, SCALES, ZEROS, w_ptrs, x_ptrs, rn, n_mask, m_mask, g, stride_sg, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """Group g's share of the sums, scaled: [BLOCK_M, BLOCK_N] (USE_DOT) or per lane [BLOCK_N, 16] (the GEMV).
    w_ptrs [BLOCK_N, 16] point at the columns' group-0 words, x_ptrs at x's first 16 inputs ([BLOCK_M, 16] / [16])."""
    words = tl.load(w_ptrs + g * 16, mask=n_mask[:, None], other=0)                  # [BLOCK_N, 16] int32
    scale = tl.load(SCALES + g * stride_sg + rn, mask=n_mask, other=0.0).to(tl.float32)            # [BLOCK_N]
    zero = tl.load(ZEROS + g * stride_sg + rn, mask=n_mask, other=0).to(tl.float32)                 # [BLOCK_N]
    words_hi = words >> 12
    if USE_DOT:
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in tl.static_range(8):  # pyright: ignore[reportGeneralTypeIssues]  (inputs 128 g + 16 i ..)
            w = _codes_minus_zero(words, words_hi, zero, i)                          # [BLOCK_N, 16]
            x = tl.load(x_ptrs + g * 128 + 16 * i, mask=m_mask[:, None], other=0.0)   # [BLOCK_M, 16]
            if DOT_IN_FP32:
                part = tl.dot(x.to(tl.float32), tl.trans(w), part)
            else:
                part = tl.dot(x, tl.trans(w.to(x.dtype)), part)
        sums = part * scale[None, :]
    else:
        part = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
        for i in tl.static_range(8):  # pyright: ignore[reportGeneralTypeIssues]
            w = _codes_minus_zero(words, words_hi, zero, i)                          # [BLOCK_N, 16]
            x = tl.load(x_ptrs + g * 128 + 16 * i).to(tl.float32)                     # [16]
            part += w * x[None, :]
        sums = part * scale[:, None]
    return sums


@triton_jit
def _finish(acc, up, BIAS, OUT, rn, n_mask, N, GATED: tl.constexpr, HAS_BIAS: tl.constexpr):
    """fp32 sums [BLOCK_M, BLOCK_N] (and the up half's, GATED) -> the output tile in OUT's dtype, rounded as torch's
    path rounds: the GEMM result (plus bias) to the dtype; GATED: silu in fp32 rounded to the dtype, times up
    (rounded), rounded once more (nv_kernels.fused_act)."""
    y = acc
    if HAS_BIAS:
        y += tl.load(BIAS + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y = y.to(OUT.dtype.element_ty)
    if GATED:
        u = up
        if HAS_BIAS:
            u += tl.load(BIAS + N + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        u = u.to(OUT.dtype.element_ty).to(tl.float32)
        g = y.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
        y = (act * u).to(OUT.dtype.element_ty)
    return y


@triton_jit(do_not_specialize=["M", "GROUPS_PER_SPLIT", "SPLIT_K"])   # vary per call: one variant for all
def int4_gemm_kernel(X, QW, SCALES, ZEROS, BIAS, OUT, PART, COUNTERS, M, N, K, GROUPS_PER_SPLIT, SPLIT_K,
                     stride_xm, stride_qn, stride_sg, stride_om, stride_ps,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr, SPLIT: tl.constexpr,
                     GATED: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                     NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr = False, PAIRS: tl.constexpr = False):
    # X [M, K], OUT [M, N] in the model dtype; grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)).
    # GATED: the weight has 2 N rows, [gate; up], and OUT = silu(gate) * up; the up rows of these columns sit N rows
    # further down (their scales and zeros N columns further right).
    # SPLIT (SPLIT_K > 1, one M block only): PART fp32 [SPLIT_K, M, N (2 N when GATED)] (stride_ps between splits),
    # COUNTERS int32 [cdiv(N, BLOCK_N)], all 0 on entry.
    # USE_PDL (nv_kernels.dependent_launch, one-row launches): launched while the previous kernel runs, every program
    # waits for it before its first read or write, and lets the next kernel launch.
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                                 # [BLOCK_N] output columns
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                                 # [BLOCK_M] rows of x
    rj = tl.arange(0, 16)                                                        # word of a group
    n_mask = rn < N
    m_mask = rm < M
    g_lo = pid_k * GROUPS_PER_SPLIT
    g_hi = tl.minimum(g_lo + GROUPS_PER_SPLIT, K // 128)
    w_ptrs = QW + rn.to(tl.int64)[:, None] * stride_qn + rj[None, :]            # [BLOCK_N, 16]: group 0
    up_ptrs = QW + (rn.to(tl.int64) + N)[:, None] * stride_qn + rj[None, :]      # GATED: the up rows' words
    if PAIRS:   # x^T [128, BLOCK_M] in the weight tile's input order: row c <-> input 16 P + 64 h + j
        rc = tl.arange(0, 128)
        xk = 16 * (rc // 32) + 64 * (rc % 2) + (rc // 2) % 16
        x_ptrs = X + rm[None, :] * stride_xm + xk[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)                    # transposed until the epilogue
    elif USE_DOT:
        x_ptrs = X + rm[:, None] * stride_xm + rj[None, :]                       # [BLOCK_M, 16]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:   # M == 1
        x_ptrs = X + rj                                                          # [16]
        acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    up = acc
    for g in tl.range(g_lo, g_hi, num_stages=NUM_STAGES):  # pyright: ignore[reportGeneralTypeIssues]
        if PAIRS:
            x_tile = tl.load(x_ptrs + g * 128, mask=m_mask[None, :], other=0.0)     # [128, BLOCK_M]
            if DOT_IN_FP32:
                x_tile = x_tile.to(tl.float32)
            acc += _pair_sums(QW, SCALES, ZEROS, w_ptrs, x_tile, rn, n_mask, g, stride_sg, BLOCK_N, DOT_IN_FP32)
            if GATED:
                up += _pair_sums(QW, SCALES + N, ZEROS + N, up_ptrs, x_tile, rn, n_mask, g, stride_sg, BLOCK_N,
                                 DOT_IN_FP32)
        else:
            acc += _group_sums(QW, SCALES, ZEROS, w_ptrs, x_ptrs, rn, n_mask, m_mask, g, stride_sg, BLOCK_M,
                               BLOCK_N, USE_DOT, DOT_IN_FP32)
            if GATED:
                up += _group_sums(QW, SCALES + N, ZEROS + N, up_ptrs, x_ptrs, rn, n_mask, m_mask, g, stride_sg,
                                  BLOCK_M, BLOCK_N, USE_DOT, DOT_IN_FP32)
    if PAIRS:
        acc = tl.trans(acc)                                                      # [BLOCK_M, BLOCK_N]
        up = tl.trans(up)
    elif not USE_DOT:
        acc = tl.sum(acc, axis=1)[None, :]                                       # [1, BLOCK_N]
        up = tl.sum(up, axis=1)[None, :]
    mask = m_mask[:, None] & n_mask[None, :]                                      # [BLOCK_M, BLOCK_N]
    out_ptrs = OUT + rm[:, None] * stride_om + rn[None, :]
    if not SPLIT:
        tl.store(out_ptrs, _finish(acc, up, BIAS, OUT, rn, n_mask, N, GATED, HAS_BIAS), mask=mask)
    else:
        part_cols = N * 2 if GATED else N
        part_ptrs = PART + rm[:, None] * part_cols + rn[None, :]
        # SPLIT_K is a run-time integer here: the last split's reduction is a loop, not unrolled
        split_k_epilogue(acc, up, part_ptrs, out_ptrs, mask, COUNTERS, pid_n, pid_k, stride_ps, N, SPLIT_K, _finish,
                         BIAS, OUT, rn, n_mask, GATED, HAS_BIAS)
