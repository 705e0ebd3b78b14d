"""Skinny GEMM for small-batch decode: y[M, N] = x[M, K] @ W[N, K]^T for M <= 16, in Triton.

At decode batch sizes a linear layer is bound by streaming its weight from HBM once; cuBLAS's tiles for
small M reach about a third of the bandwidth on Qwen3-0.6B's projections (H200). Here each program owns
BLOCK_N output columns and streams their weight rows W[BLOCK_N, K] along K (contiguous, 16-byte loads);
x (M x K) is tiny and stays in cache. Shapes with few column blocks (N = 1024, K = 3072) split K over
SPLIT_K programs per block: each writes fp32 partial sums and a second small kernel adds them up and
applies the epilogue (no atomics, no zero-fill: CUDA-graph safe and deterministic).

Variants (constexpr):
  USE_DOT   M padded to 16 and tl.dot on the tensor cores; else a broadcast multiply-reduce on the CUDA
            cores with M padded to a power of two (for M = 1 the classic GEMV, x broadcast over the tile).
  GATED     the gate_up projection of a SwiGLU MLP with SiLU-and-mul fused: W holds [gate; up] stacked
            (N_w = 2 I rows, as MergedColumnParallelLinear stores them); output column j needs rows j and
            j + I, and out[M, I] = silu(gate) * up.
  HAS_BIAS  y += bias (N_w entries) before the epilogue.
Numerics as torch's path in the model dtype: fp32 accumulation, the GEMM result (plus bias) rounded to the
dtype; gated: silu in fp32 rounded to the dtype, the product in fp32 rounded once more (nv_kernels.fused_act).

`SkinnyGemmConfig` is a launch configuration; `choose_config` reads `TUNED_CONFIGS` (keyed by the weight
shape and the M bucket, filled from scripts/bench_small_gemm.py on the GPU) and falls back to a heuristic.
The layers dispatch here when `skinny_gemm_applies`; NV_SKINNY_GEMM=0 (or `set_skinny_gemm(False)`)
turns the dispatch off for A/B runs.
Only builtins and jit helpers of this module inside the kernels (see fused_norm's note on the interpreter).
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nv_kernels.fused_dispatch import fused_ops_enabled, next_power_of_2, triton_jit

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

_empty = torch.empty  # tests poison outputs and workspaces through this hook

MAX_M = 16                                     # rows (tokens) the kernels take; more go to cuBLAS
DTYPES = (torch.bfloat16, torch.float16)
DEFAULT_NUM_SMS = 132                          # H100 / H200; the heuristic's target off CUDA (interpreter)
# Triton's interpreter computes tl.dot of bf16 tiles wrongly (numpy has no bf16): there the dot path upcasts
# its tiles to fp32 first.
_DOT_IN_FP32 = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """One launch configuration. block_n: output columns per program (>= 16 with use_dot); block_k: the K
    step of the loop; split_k: programs per column block along K (1: no reduce kernel); use_dot: tl.dot
    with M padded to 16, else the CUDA-core multiply-reduce."""

    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = True

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.use_dot and (self.block_n < 16 or self.block_k < 16):
            raise ValueError("use_dot needs block_n and block_k of at least 16")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"split_k, num_warps and num_stages must be positive: {self}")


# (weight rows N_w, K, M bucket (next power of two of M), gated) -> the measured best configuration.
# Filled from `scripts/bench_small_gemm.py --table` on the GPU; shapes not listed use the heuristic.
# Measured on an H200 (2026-12-01, scripts/bench_small_gemm.py, weights read from HBM): the fastest
# configuration per (weight rows, K, M bucket, gated), or None where torch's GEMM measured faster (the
# layers then keep F.linear). The gated rows stay on the skinny GEMM even where F.linear + SiLU-and-mul
# timed slightly faster alone: inside the decode step cuBLAS picked a 12.8 us kernel for that shape.
_C = SkinnyGemmConfig   # (block_n, block_k, split_k, num_warps, num_stages, use_dot)
TUNED_CONFIGS: dict[tuple[int, int, int, bool], SkinnyGemmConfig | None] = {
    # key: (weight rows, K, M bucket, gated); comment: shape, torch us / best skinny us
    (4096, 1024, 1, False): None,  # 0.6b qkv: 5.15 / 5.51
    (4096, 1024, 2, False): None,  # 0.6b qkv: 5.35 / 5.56
    (4096, 1024, 4, False): None,  # 0.6b qkv: 5.38 / 5.62
    (4096, 1024, 8, False): None,  # 0.6b qkv: 5.37 / 5.58
    (4096, 1024, 16, False): None,  # 0.6b qkv: 5.36 / 5.58
    (1024, 2048, 1, False): _C(16, 512, 4, 4, 2, False),  # 0.6b o: 13.04 / 5.59
    (1024, 2048, 2, False): _C(32, 128, 4, 4, 3, True),  # 0.6b o: 12.77 / 5.75
    (1024, 2048, 4, False): _C(32, 128, 4, 4, 3, True),  # 0.6b o: 8.60 / 5.75
    (1024, 2048, 8, False): _C(32, 256, 4, 4, 3, True),  # 0.6b o: 5.91 / 5.83
    (1024, 2048, 16, False): _C(32, 256, 4, 4, 3, True),  # 0.6b o: 5.92 / 5.79
    (6144, 1024, 1, True): _C(16, 512, 1, 4, 2, False),  # 0.6b gate_up: 7.52 / 7.76
    (6144, 1024, 2, True): _C(32, 256, 1, 4, 3, True),  # 0.6b gate_up: 7.46 / 7.97
    (6144, 1024, 4, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.50 / 8.05
    (6144, 1024, 8, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.40 / 7.99
    (6144, 1024, 16, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.66 / 8.00
    (1024, 3072, 1, False): _C(16, 512, 4, 4, 2, False),  # 0.6b down: 7.43 / 6.33
    (1024, 3072, 2, False): _C(32, 128, 8, 4, 3, True),  # 0.6b down: 7.43 / 6.57
    (1024, 3072, 4, False): _C(32, 128, 8, 4, 3, True),  # 0.6b down: 7.54 / 6.52
    (1024, 3072, 8, False): _C(32, 256, 4, 4, 3, True),  # 0.6b down: 7.58 / 6.45
    (1024, 3072, 16, False): _C(32, 256, 4, 4, 3, True),  # 0.6b down: 7.71 / 6.51
    (6144, 4096, 1, False): _C(16, 512, 1, 4, 2, False),  # 8b qkv: 16.43 / 15.54
    (6144, 4096, 2, False): None,  # 8b qkv: 16.30 / 16.39
    (6144, 4096, 4, False): None,  # 8b qkv: 16.28 / 16.46
    (6144, 4096, 8, False): None,  # 8b qkv: 16.04 / 16.58
    (6144, 4096, 16, False): None,  # 8b qkv: 16.13 / 16.70
    (4096, 4096, 1, False): _C(16, 512, 1, 4, 2, False),  # 8b o: 13.54 / 12.65
    (4096, 4096, 2, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.42 / 12.30
    (4096, 4096, 4, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.51 / 12.26
    (4096, 4096, 8, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.37 / 12.23
    (4096, 4096, 16, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.62 / 12.32
    (24576, 4096, 1, True): _C(32, 256, 1, 4, 2, False),  # 8b gate_up: 50.94 / 51.90
    (24576, 4096, 2, True): _C(32, 256, 1, 4, 3, True),  # 8b gate_up: 51.24 / 48.69
    (24576, 4096, 4, True): _C(32, 256, 1, 4, 3, True),  # 8b gate_up: 52.18 / 49.49
    (24576, 4096, 8, True): _C(32, 256, 1, 4, 3, True),  # 8b gate_up: 56.93 / 49.67
    (24576, 4096, 16, True): _C(32, 256, 1, 4, 3, True),  # 8b gate_up: 53.05 / 50.77
    (4096, 12288, 1, False): _C(32, 512, 2, 4, 2, False),  # 8b down: 30.04 / 29.09
    (4096, 12288, 2, False): _C(32, 256, 2, 4, 3, True),  # 8b down: 30.95 / 27.91
    (4096, 12288, 4, False): _C(32, 256, 2, 4, 3, True),  # 8b down: 29.81 / 28.15
    (4096, 12288, 8, False): _C(32, 256, 2, 4, 3, True),  # 8b down: 30.81 / 28.40
    (4096, 12288, 16, False): _C(32, 256, 2, 4, 3, True),  # 8b down: 29.15 / 28.62
}


def _switch_from_env() -> bool:
    value = os.environ.get("NV_SKINNY_GEMM", "1").strip().lower() or "1"
    if value not in ("0", "1", "off", "on"):
        raise ValueError(f"NV_SKINNY_GEMM={value!r} is not one of 0, 1, off, on")
    return value in ("1", "on")


_enabled = _switch_from_env()


def skinny_gemm_enabled() -> bool:
    return _enabled


def set_skinny_gemm(enabled: bool) -> bool:
    """Turn the layers' dispatch to these kernels on or off; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


@triton_jit
def _zero_sums(M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    """The running sums of one weight tile: [M_PAD, BLOCK_N] for tl.dot; the CUDA-core paths keep products
    per K lane ([BLOCK_N, BLOCK_K] for the GEMV, [M_PAD, BLOCK_N, BLOCK_K] else) and reduce them once."""
    if USE_DOT:
        sums = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    elif M_PAD == 1:
        sums = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        sums = tl.zeros((M_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
    return sums


@triton_jit
def _accumulate(sums, x, w, M_PAD: tl.constexpr, USE_DOT: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """sums += x [M_PAD, BLOCK_K] times w [BLOCK_N, BLOCK_K] in the layout of _zero_sums."""
    if USE_DOT:
        if DOT_IN_FP32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        sums = tl.dot(x, tl.trans(w), sums)
    elif M_PAD == 1:   # the GEMV: x [1, BLOCK_K] broadcasts over the tile, no 3-D layout to convert to
        sums += w.to(tl.float32) * x.to(tl.float32)
    else:
        sums += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return sums


@triton_jit
def _reduced(sums, M_PAD: tl.constexpr, USE_DOT: tl.constexpr):
    """The [M_PAD, BLOCK_N] fp32 result of _zero_sums / _accumulate sums. tl.sum's own combine function:
    compiled, the reduction tl.sum emits; interpreted, numpy's sum (one of this module would run per element)."""
    if USE_DOT:
        out = sums
    elif M_PAD == 1:
        out = tl.reduce(sums, 1, tl.standard._sum_combine)[None, :]
    else:
        out = tl.reduce(sums, 2, tl.standard._sum_combine)
    return out


@triton_jit
def _rows_times_x(x_ptrs, w_ptrs, up_offset, m_mask, n_mask, k_lo, k_hi, M_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, GATED: tl.constexpr,
                  EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr):
    """sum over k in [k_lo, k_hi) of x[m, k] * w[n, k] -> [M_PAD, BLOCK_N] fp32, and with GATED the same
    for the rows up_offset elements further (the up half) in the same loop; else the second result is the
    first. x_ptrs [M_PAD, BLOCK_K] and w_ptrs [BLOCK_N, BLOCK_K] point at k = 0..BLOCK_K-1 of their rows."""
    rk = tl.arange(0, BLOCK_K)
    gate = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    up = _zero_sums(M_PAD, BLOCK_N, BLOCK_K, USE_DOT)
    # num_stages on the loop itself: the weight loads are software-pipelined (cp.async) on every path, not
    # only where they feed tl.dot
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):  # pyright: ignore[reportGeneralTypeIssues]
        if EVEN_K:   # every step is a whole block: no K mask, the loads stay 16-byte vectors
            x_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
        else:
            k_mask = (k0 + rk) < k_hi
            x_mask = m_mask[:, None] & k_mask[None, :]
            w_mask = n_mask[:, None] & k_mask[None, :]
        x = tl.load(x_ptrs + k0, mask=x_mask, other=0.0)                              # [M_PAD, BLOCK_K]
        w = tl.load(w_ptrs + k0, mask=w_mask, other=0.0)                              # [BLOCK_N, BLOCK_K]
        if GATED:   # both tiles' loads in flight before either is used
            w_up = tl.load(w_ptrs + up_offset + k0, mask=w_mask, other=0.0)
            gate = _accumulate(gate, x, w, M_PAD, USE_DOT, DOT_IN_FP32)
            up = _accumulate(up, x, w_up, M_PAD, USE_DOT, DOT_IN_FP32)
        else:
            gate = _accumulate(gate, x, w, M_PAD, USE_DOT, DOT_IN_FP32)
    gate_sums = _reduced(gate, M_PAD, USE_DOT)
    up_sums = gate_sums
    if GATED:
        up_sums = _reduced(up, M_PAD, USE_DOT)
    return gate_sums, up_sums


@triton_jit
def _finish(acc, up, BIAS, OUT, cols, col_mask, N, GATED: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The epilogue on fp32 sums (acc: columns `cols`; up: columns N + cols when GATED) -> OUT's dtype."""
    y = acc
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = y.to(OUT.dtype.element_ty)                                        # the GEMM output, as torch rounds it
    if GATED:
        u = up
        if HAS_BIAS:
            u += tl.load(BIAS + N + cols, mask=col_mask, other=0.0).to(tl.float32)
        u = u.to(OUT.dtype.element_ty).to(tl.float32)
        g = y.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
        y = (act * u).to(OUT.dtype.element_ty)
    return y


@triton_jit(do_not_specialize=["M"])   # the batch size varies; M_PAD is its compile-time bucket
def _skinny_gemm_kernel(
    X, W, BIAS, OUT, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_om, stride_os, up_offset,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    # X [M, K], W [N_w, K] (N_w = 2N when GATED), grid (cdiv(N, BLOCK_N), SPLIT_K).
    # GATED: the up rows of these columns sit N rows (up_offset = N * stride_wn elements) further down.
    # PARTIAL: OUT is fp32 [SPLIT_K, M, N_w] (stride_os between splits), sums before bias and epilogue;
    # else OUT is [M, N] in the model dtype.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                          # [BLOCK_N] output columns
    rm = tl.arange(0, M_PAD)                                              # [M_PAD] rows of x
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    x_ptrs = X + rm[:, None] * stride_xm + rk[None, :]                    # [M_PAD, BLOCK_K]
    w_ptrs = W + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]       # [BLOCK_N, BLOCK_K]
    acc, up = _rows_times_x(x_ptrs, w_ptrs, up_offset, m_mask, n_mask, k_lo, k_hi, M_PAD,
                            BLOCK_N, BLOCK_K, USE_DOT, GATED, EVEN_K, DOT_IN_FP32, NUM_STAGES)
    mask = m_mask[:, None] & n_mask[None, :]                              # [M_PAD, BLOCK_N]
    out_ptrs = OUT + pid_k * stride_os + rm[:, None] * stride_om + rn[None, :]
    if PARTIAL:
        tl.store(out_ptrs, acc, mask=mask)
        if GATED:
            tl.store(out_ptrs + N, up, mask=mask)
    else:
        y = _finish(acc, up, BIAS, OUT, rn[None, :], n_mask[None, :], N, GATED, HAS_BIAS)
        tl.store(out_ptrs, y, mask=mask)


@triton_jit(do_not_specialize=["M"])
def _split_k_reduce_kernel(PART, BIAS, OUT, M, N, stride_ps, stride_pm, stride_om, SPLIT_K: tl.constexpr,
                           BLOCK: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr):
    # PART fp32 [SPLIT_K, M, N_w] -> OUT [M, N]; grid (M, cdiv(N, BLOCK))
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)                 # [BLOCK]
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    up = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):   # a fixed order: the sum does not depend on scheduling
        part = PART + s * stride_ps + row * stride_pm
        acc += tl.load(part + cols, mask=mask, other=0.0)
        if GATED:
            up += tl.load(part + N + cols, mask=mask, other=0.0)
    y = _finish(acc, up, BIAS, OUT, cols, mask, N, GATED, HAS_BIAS)
    tl.store(OUT + row * stride_om + cols, y, mask=mask)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _m_bucket(m: int) -> int:
    return next_power_of_2(max(m, 1))


@functools.lru_cache(maxsize=1024)
def heuristic_config(weight_rows: int, k: int, m: int, gated: bool, num_sms: int = DEFAULT_NUM_SMS
                     ) -> SkinnyGemmConfig:
    """Enough programs to cover every SM: BLOCK_N 16 (32 when the columns alone give two waves), then
    split K in two until the programs cover the SMs or a split would hold fewer than two K steps.
    M = 1: the CUDA-core GEMV (no padded rows in shared memory); larger M on the tensor cores (padded to 16).
    Both pipeline their weight loads over num_stages."""
    n_out = weight_rows // 2 if gated else weight_rows
    block_k = min(256, max(16, next_power_of_2(k)))
    block_n = 32 if math.ceil(n_out / 32) >= 2 * num_sms else 16
    column_blocks = math.ceil(n_out / block_n)
    split_k = 1
    while column_blocks * split_k < num_sms and k // (2 * split_k) >= 2 * block_k:
        split_k *= 2
    return SkinnyGemmConfig(block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=3,
                            use_dot=m > 1)


def choose_config(weight_rows: int, k: int, m: int, gated: bool, device: torch.device | None = None
                  ) -> SkinnyGemmConfig:
    """The tuned configuration of this shape and M bucket, else the heuristic's."""
    tuned = TUNED_CONFIGS.get((weight_rows, k, _m_bucket(m), gated))
    if tuned is not None:          # None (torch measured faster) only reaches here through a direct call
        return tuned
    num_sms = _num_sms(device) if device is not None else DEFAULT_NUM_SMS
    return heuristic_config(weight_rows, k, m, gated, num_sms)


def skinny_gemm_applies(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether the layers should call `skinny_gemm` for x [..., K] @ weight [N_w, K]^T (+ bias): the switch
    is on, fused ops run on these tensors (CUDA), all are bf16 / fp16 of one dtype and x has 1..MAX_M rows."""
    if not _enabled or x.dtype not in DTYPES or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 1:
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (weight.shape[0],)):
        return False
    rows = math.prod(x.shape[:-1])
    if not (0 < rows <= MAX_M and x.shape[-1] == weight.shape[1]):
        return False
    key = (weight.shape[0], weight.shape[1], _m_bucket(rows), False)
    if key in TUNED_CONFIGS and TUNED_CONFIGS[key] is None:
        return False               # torch measured faster at this plain shape
    return fused_ops_enabled(x, weight)


def skinny_gemm_torch(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated: bool = False) -> Tensor:
    """The reference: F.linear, then silu(gate) * up when gated."""
    y = F.linear(x, weight, bias)
    if not gated:
        return y
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, gated: bool) -> None:
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"skinny_gemm takes bf16 / fp16 x and weight of one dtype, got {x.dtype} and "
                         f"{weight.dtype}")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    if math.prod(x.shape[:-1]) > MAX_M:
        raise ValueError(f"skinny_gemm takes at most {MAX_M} rows, got {math.prod(x.shape[:-1])}")
    if gated and weight.shape[0] % 2:
        raise ValueError(f"a gated weight stacks [gate; up]: its rows must be even, got {weight.shape[0]}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{weight.shape[0]}] of {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")


def skinny_gemm(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated: bool = False,
                config: SkinnyGemmConfig | None = None) -> Tensor:
    """x [..., K] (at most MAX_M rows) @ weight [N_w, K]^T (+ bias [N_w]) -> [..., N_w], or with gated
    -> silu(gate) * up [..., N_w / 2]. A new tensor; config None: `choose_config`."""
    _check(x, weight, bias, gated)
    k, weight_rows = x.shape[-1], weight.shape[0]
    n_out = weight_rows // 2 if gated else weight_rows
    x2 = x.reshape(-1, k)                                                  # [M, K]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    m = x2.shape[0]
    out = _empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = out.view(m, n_out)                                              # [M, N]
    if m == 0 or n_out == 0:
        return out
    if k == 0:
        return out.copy_(skinny_gemm_torch(x, weight, bias, gated=gated))
    cfg = config if config is not None else choose_config(weight_rows, k, m, gated, x.device)
    m_pad = 16 if cfg.use_dot else _m_bucket(m)
    k_per_split = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
    split_k = math.ceil(k / k_per_split)                                   # no empty splits
    even_k = k % cfg.block_k == 0
    grid = (math.ceil(n_out / cfg.block_n), split_k)
    bias_arg = bias if bias is not None else x2
    up_offset = n_out * weight.stride(0)                                   # gated: from a gate row to its up row
    common = dict(M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot, GATED=gated,
                  HAS_BIAS=bias is not None, EVEN_K=even_k, DOT_IN_FP32=_DOT_IN_FP32, NUM_STAGES=cfg.num_stages,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split_k == 1:
        _skinny_gemm_kernel[grid](x2, weight, bias_arg, out2, m, n_out, k, k_per_split, x2.stride(0),
                                  weight.stride(0), out2.stride(0), 0, up_offset, PARTIAL=False, **common)
        return out
    partials = _empty((split_k, m, weight_rows), dtype=torch.float32, device=x.device)   # [S, M, N_w]
    _skinny_gemm_kernel[grid](x2, weight, bias_arg, partials, m, n_out, k, k_per_split, x2.stride(0),
                              weight.stride(0), partials.stride(1), partials.stride(0), up_offset, PARTIAL=True,
                              **common)
    block = min(1024, next_power_of_2(n_out))
    _split_k_reduce_kernel[(m, math.ceil(n_out / block))](
        partials, bias_arg, out2, m, n_out, partials.stride(0), partials.stride(1), out2.stride(0),
        SPLIT_K=split_k, BLOCK=block, GATED=gated, HAS_BIAS=bias is not None, num_warps=4)
    return out
