"""`DecodeLayer`: one pre-norm GQA decoder layer with a SwiGLU MLP (Qwen3, Llama) run for a decode step in a
single persistent Triton launch (nv_kernels.decode_layer_kernel): both RMSNorms with their residual adds, the
q/k/v, o, gate/up and down projections, q/k norm and rotary, the new token's k / v stored into the paged cache,
and split-KV attention with its merge.

Why: at decode batch sizes each separate kernel costs ~4-6 us on an H200 whatever it reads (a launch, a ramp,
a drain), and a layer needs six of them; the layer's weights (31.5 MB at the Qwen3-0.6B shape) stream in ~7 us.
Here the phases are separated by grid barriers in one resident grid, and every program asks L2 for all the
weight rows it will need before the first phase, so HBM streams the whole layer while the phases run.
Idea from persistent "megakernels" (Hazy Research's no-bubbles Llama-1B forward, Mirage); no code taken.
Measured on the H200 (BENCHMARKS.md, eleventh pass): 37.8 us per layer at one row against ~32 us for the separate
kernels; each grid barrier costs 2-5 us and the phases stream no faster than the separate kernels. So the
layers use it only with NV_DECODE_LAYER=1.

For 1..MAX_ROWS rows (tokens), bf16 / fp16 weights without biases, rotary over the whole head, a 16-bit or FP8
cache in the layouts of nv_kernels.kv_layout. The grid has as many programs as can all be resident at once (at
most MAX_PROGRAMS_PER_SM per SM, checked against the compiled variant), so it must run alone on its stream's
device (as every decode kernel does: one stream per device). Numerics are the separate kernels' (skinny GEMM,
fused decode): equal up to the order of fp32 sums.
"""
# The Triton launch: pyright cannot type a @triton.jit call's constexpr and launch keywords.
# pyright: reportArgumentType=false, reportCallIssue=false
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch import Tensor
from triton.runtime.errors import OutOfResources

from nv_kernels.decode_layer_kernel import decode_layer_kernel
from nv_kernels.decode_tuning import choose_tile
from nv_kernels.dependent_launch import launch_options
from nv_kernels.kv_layout import check_cache_layout, v_strides_token_major
from nv_kernels.kv_quant import fp8_max, is_fp8, scale_strides
from nv_kernels.skinny_gemm import DOT_IN_FP32_INTERPRETED  # the interpreter's bf16 dots are wrong: fp32 there
from nv_kernels.sm_count import cuda_sm_count
from nv_kernels.split_k_workspace import SplitKWorkspace
from nv_kernels.triton_decode import LOG2E, compute_dtype

MAX_ROWS = 16                      # rows the kernel takes (M padded to 16 on the tensor-core path)
MAX_PROGRAMS_PER_SM = int(os.environ.get("NV_DECODE_LAYER_PROGRAMS_PER_SM", "4"))   # the grid's upper bound
MAX_SPLITS = 32                    # attention splits per (sequence, KV head)
MIN_TOKENS_PER_SPLIT = 64
GEMV_TILE_ELEMENTS = 8192          # fp32 running sums per program on the CUDA-core path (one row)
# Tensor-core path: the K steps of an item are unrolled so that all their loads are in flight, and each step's
# x and weight tiles are staged in shared memory; unrolled steps are capped at this many staged bytes (the
# Qwen3-0.6B shape's largest, 160 KB, fits an H100 / H200 SM's 227 KB; Qwen3-8B's down projection unrolled
# whole would stage 1.1 MB).
DOT_STAGED_BYTES = 160 << 10
WORKSPACE = SplitKWorkspace()      # fp32 partial sums and arrival counters, per device


@dataclass(frozen=True)
class GemmTiles:
    """How one projection is cut into work items: block_n output columns by k / split_k inputs each, walked in
    steps of block_k, `unroll` steps at a time (a divisor of the steps)."""

    block_n: int
    block_k: int
    split_k: int
    unroll: int = 1


def _largest_power_of_two_dividing(n: int, cap: int) -> int:
    block = 1
    while block * 2 <= cap and n % (block * 2) == 0:
        block *= 2
    return block


def gemm_tiles(n_out: int, k: int, gated: bool, use_dot: bool, programs: int, may_split: bool) -> GemmTiles:
    """The cut whose busiest program streams the fewest weight elements (ties: fewer splits, then fewer items).
    Gated projections are not split along K (their epilogue needs both halves whole)."""
    rows_per_column = 2 if gated else 1
    best: tuple[tuple[int, int, int], GemmTiles] | None = None
    for block_n in (16, 32, 64):
        for split in (1, 2, 4) if may_split and not gated else (1,):
            if k % split:
                continue
            k_split = k // split
            cap = 256 if use_dot else max(16, GEMV_TILE_ELEMENTS // (block_n * rows_per_column))
            block_k = _largest_power_of_two_dividing(k_split, cap)
            if use_dot and block_k < 16:
                continue
            items = math.ceil(n_out / block_n) * split
            busiest = math.ceil(items / programs) * block_n * rows_per_column * k_split
            key = (busiest, split, items)
            if best is None or key < best[0]:
                best = (key, GemmTiles(block_n, block_k, split))
    if best is None:
        raise ValueError(f"no tiling of a [{n_out}, {k}] projection for the decode layer kernel")
    tiles = best[1]
    steps = k // tiles.split_k // tiles.block_k
    unroll = steps
    if use_dot:   # x [16, block_k] and the weight rows [block_n (x2 gated), block_k] of a step, 16-bit
        staged = (16 + tiles.block_n * rows_per_column) * tiles.block_k * 2
        unroll = max(d for d in range(1, steps + 1) if steps % d == 0 and (d == 1 or d * staged <= DOT_STAGED_BYTES))
    return GemmTiles(tiles.block_n, tiles.block_k, tiles.split_k, unroll)


def choose_splits(rows: int, num_kv_heads: int, max_seqlen_k: int, programs: int) -> int:
    """Attention splits per (sequence, KV head): as many as keep the items within one per program (a power of
    two), at least MIN_TOKENS_PER_SPLIT tokens each. Static facts only: CUDA-graph safe."""
    fit = max(1, programs // max(1, rows * num_kv_heads))
    by_length = max(1, max_seqlen_k // MIN_TOKENS_PER_SPLIT)
    splits = max(1, min(fit, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


def _resident_per_sm(kernel: Any, device: torch.device, num_warps: int) -> int:
    """Programs of a compiled kernel that fit on one SM at once (registers, shared memory, threads); 0 when
    one program needs more shared memory than an SM has (a grid's tiles that cannot run)."""
    key = (id(kernel), device)
    if key not in _RESIDENT:
        init = getattr(kernel, "_init_handles", None)
        if init is not None:
            try:
                init()
            except OutOfResources:
                _RESIDENT[key] = 0
                return 0
        props = torch.cuda.get_device_properties(device)
        regs_per_warp = math.ceil(kernel.n_regs * 32 / 256) * 256
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
        shared = kernel.metadata.shared
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        by_smem = smem // (shared + 1024) if shared else 32
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * num_warps)
        _RESIDENT[key] = min(by_regs, by_smem, by_threads, 32)
    return _RESIDENT[key]


_RESIDENT: dict[tuple[int, torch.device], int] = {}
_PER_SM: dict[tuple, int] = {}        # programs per SM by everything that picks the kernel's variant


def _lines(k: int) -> int:
    return triton.next_power_of_2(max(1, math.ceil(k / 64)))


@dataclass(frozen=True)
class DecodeLayer:
    """One layer's weights and shape. Weights as the layers store them: qkv [(Hq + 2 Hkv) D, H], o [H, Hq D],
    gate_up [2 I, H] ([gate; up]), down [H, I]; norms [H]; q_norm / k_norm [D] (None: no q/k norm, as Llama);
    cos_sin_cache [P, D] (cos | sin halves)."""

    input_norm: Tensor
    post_norm: Tensor
    qkv: Tensor
    o: Tensor
    gate_up: Tensor
    down: Tensor
    cos_sin_cache: Tensor
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    qk_eps: float = 1e-6

    def check(self) -> None:
        """ValueError unless the weights fit one another and the kernel."""
        hidden = self.input_norm.shape[0]
        heads, kv, d = self.num_q_heads, self.num_kv_heads, self.head_dim
        inter = self.down.shape[1]
        dtype = self.qkv.dtype
        shapes = {"qkv": (self.qkv, ((heads + 2 * kv) * d, hidden)), "o": (self.o, (hidden, heads * d)),
                  "gate_up": (self.gate_up, (2 * inter, hidden)), "down": (self.down, (hidden, inter)),
                  "input_norm": (self.input_norm, (hidden,)), "post_norm": (self.post_norm, (hidden,))}
        if self.q_norm is not None or self.k_norm is not None:
            shapes.update(q_norm=(self.q_norm, (d,)), k_norm=(self.k_norm, (d,)))
        for name, (t, shape) in shapes.items():
            if t is None or tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"DecodeLayer.{name} must be a contiguous {shape} tensor of {dtype}, got "
                                 f"{None if t is None else (tuple(t.shape), t.dtype)}")
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"DecodeLayer runs bf16 / fp16 weights, got {dtype}")
        if heads % kv or d % 2 or self.cos_sin_cache.dim() != 2 or self.cos_sin_cache.shape[1] != d:
            raise ValueError("DecodeLayer needs whole GQA groups and rotary over the whole (even) head: "
                             f"cos_sin_cache [P, {d}], got {tuple(self.cos_sin_cache.shape)}")

    @staticmethod
    def _programs_per_sm(launch: Callable[[int, bool], Any], sms: int, device: torch.device, num_warps: int) -> int:
        """The most programs per SM (MAX_PROGRAMS_PER_SM, halved until it fits) that are all resident at once,
        from the compiled variant's registers and shared memory: a program that could not start would never
        arrive at the grid barrier. Cached per variant."""
        per_sm = MAX_PROGRAMS_PER_SM
        while per_sm >= 1:
            kernel = launch(sms * per_sm, True)
            if _resident_per_sm(kernel, device, num_warps) >= per_sm:
                return per_sm
            per_sm //= 2
        raise ValueError("no grid of the persistent decoder-layer kernel fits this GPU (shared memory)")

    def __call__(self, hidden: Tensor, residual: Tensor | None, *, k_cache: Tensor, v_cache: Tensor,
                 seq_lens: Tensor, block_tables: Tensor, positions: Tensor, slot_mapping: Tensor,
                 max_seqlen_k: int, scale: float, k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                 programs: int | None = None, num_splits: int | None = None, prefetch: bool = True,
                 num_warps: int = 4, timestamps: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """hidden [M, H] (the previous layer's MLP output, or the embeddings with residual None) -> (this
        layer's MLP output [M, H], the residual stream after its attention [M, H]), as DecoderLayer returns
        them. One new token per row: positions / slot_mapping [M] int64 (slot < 0 stores nothing),
        seq_lens [M] int32 (incl. the new token), block_tables [M, W] int32. programs: the grid (default one
        per SM; 1 off CUDA, where the interpreter runs programs one after another); num_splits: attention
        splits (default choose_splits); prefetch: L2 prefetch of the layer's weights first (CUDA only);
        timestamps: int64 [programs, 16] for each program's timer after each phase (the kernel's TIMED)."""
        rows, hidden_size = hidden.shape
        if not 0 < rows <= MAX_ROWS or hidden_size != self.input_norm.shape[0] or hidden.dtype != self.qkv.dtype:
            raise ValueError(f"DecodeLayer takes 1..{MAX_ROWS} rows of {self.input_norm.shape[0]} "
                             f"{self.qkv.dtype}, got {tuple(hidden.shape)} {hidden.dtype}")
        if residual is not None and (residual.shape != hidden.shape or residual.dtype != hidden.dtype):
            raise ValueError("the residual must have hidden's shape and dtype")
        check_cache_layout(k_cache, v_cache)
        fp8 = is_fp8(k_cache.dtype)
        if fp8 and (k_scale is None or v_scale is None):
            raise ValueError(f"an FP8 KV cache ({k_cache.dtype}) needs k_scale and v_scale")
        if not fp8 and k_cache.dtype != hidden.dtype:
            raise ValueError(f"a 16-bit KV cache must hold the model dtype {hidden.dtype}, got {k_cache.dtype}")
        device = hidden.device
        sms = cuda_sm_count(device)
        x = hidden.contiguous()
        res = x if residual is None else residual.contiguous()
        out = torch.empty_like(x)
        r2 = torch.empty_like(x)
        heads, kv, d = self.num_q_heads, self.num_kv_heads, self.head_dim
        inter = self.down.shape[1]
        qkv_n, attn_n = (heads + 2 * kv) * d, heads * d
        scratch = torch.empty(rows * (hidden_size + qkv_n + attn_n + inter), dtype=x.dtype, device=device)
        r1, qkv, attn, act = scratch.split([rows * hidden_size, rows * qkv_n, rows * attn_n, rows * inter])
        if residual is None:
            r1 = x                       # the first layer: r1 = x, nothing to store
        group_pad = max(16, triton.next_power_of_2(heads // kv))
        # fp32 partials: split-K [SPLIT_K <= 4, 16, H], then attention [M, Hq, S, D] and [M, Hq, S], sized for
        # any row count at the default splits (M * Hkv * S <= the grid), so the buffer never grows after a first call
        most_programs = max(programs or 0, (sms or 1) * MAX_PROGRAMS_PER_SM)
        part_gemm = MAX_ROWS * hidden_size * 4
        part_attn = max(rows * kv * (num_splits or 1), most_programs, MAX_ROWS * kv) * (heads // kv) * (d + 1)
        partials = WORKSPACE.partials(device, part_gemm + part_attn)
        col_blocks = math.ceil(hidden_size / 16)
        counters = WORKSPACE.counters(device, 2 + MAX_ROWS * kv + 2 * col_blocks)
        sync, merge = counters[:2], counters[2:2 + MAX_ROWS * kv]
        o_counters = counters[2 + MAX_ROWS * kv:2 + MAX_ROWS * kv + col_blocks]
        down_counters = counters[2 + MAX_ROWS * kv + col_blocks:]
        q_norm = self.q_norm if self.q_norm is not None else self.input_norm
        k_norm = self.k_norm if self.k_norm is not None else self.input_norm
        ks = k_scale if k_scale is not None else partials
        vs = v_scale if v_scale is not None else partials
        k_strides = scale_strides(k_scale) if k_scale is not None else (0, 0)
        v_strides = scale_strides(v_scale) if v_scale is not None else (0, 0)
        block_size = k_cache.shape[1]
        use_dot = rows > 1

        def launch(grid: int, warmup: bool):
            qkv_t = gemm_tiles(qkv_n, hidden_size, False, use_dot, grid, False)
            o_t = gemm_tiles(hidden_size, attn_n, False, use_dot, grid, True)
            gu_t = gemm_tiles(inter, hidden_size, True, use_dot, grid, False)
            down_t = gemm_tiles(hidden_size, inter, False, use_dot, grid, True)
            splits = num_splits or choose_splits(rows, kv, max_seqlen_k, grid)
            part_o = partials[part_gemm:part_gemm + rows * heads * splits * d]
            part_lse = partials[part_gemm + rows * heads * splits * d:]
            args = (
                x, res, r1, r2, out, hidden_size,
                self.input_norm, self.post_norm, self.qkv, self.o, self.gate_up, self.down, q_norm, k_norm,
                qkv, attn, act, part_o, part_lse, partials,
                sync, merge, o_counters, down_counters,
                k_cache, v_cache, block_tables, seq_lens, positions, slot_mapping, self.cos_sin_cache, ks, vs,
                partials if timestamps is None else timestamps, rows, float(self.eps), float(self.qk_eps),
                scale * LOG2E, block_tables.stride(0), self.cos_sin_cache.stride(0), k_cache.stride(0),
                k_cache.stride(1), k_cache.stride(2), *v_cache.stride(), *k_strides, *v_strides,
            )
            constants = dict(
                HIDDEN=hidden_size, INTER=inter, NUM_Q_HEADS=heads, NUM_KV_HEADS=kv, HEAD_DIM=d,
                D_PAD=triton.next_power_of_2(d), GROUP_PAD=group_pad, BLOCK_SIZE=block_size,
                TILE=choose_tile(block_size, d, fp8) if x.is_cuda else 16, NUM_SPLITS=splits,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32", FP8=fp8,
                COMPUTE=compute_dtype(x.dtype, k_cache.dtype), V_TOKEN_MAJOR=v_strides_token_major(v_cache),
                HAS_QK_NORM=self.q_norm is not None, FP8_MAX=fp8_max(k_cache.dtype) if fp8 else 0.0,
                HAS_RESIDUAL=residual is not None, M_PAD=16 if use_dot else 1, USE_DOT=use_dot,
                DOT_IN_FP32=DOT_IN_FP32_INTERPRETED, BN_QKV=qkv_t.block_n, BK_QKV=qkv_t.block_k, BN_O=o_t.block_n,
                BK_O=o_t.block_k, SPLIT_O=o_t.split_k, BN_GU=gu_t.block_n, BK_GU=gu_t.block_k,
                BN_DOWN=down_t.block_n, BK_DOWN=down_t.block_k, SPLIT_DOWN=down_t.split_k, U_QKV=qkv_t.unroll,
                U_O=o_t.unroll, U_GU=gu_t.unroll, U_DOWN=down_t.unroll,
                NUM_STAGES=3 if use_dot else 2, PREFETCH=prefetch and x.is_cuda, LINES_QKV=_lines(hidden_size),
                LINES_O=_lines(attn_n // o_t.split_k), LINES_GU=_lines(hidden_size),
                LINES_DOWN=_lines(inter // down_t.split_k), TIMED=timestamps is not None,
                RSTD_BLOCK=min(triton.next_power_of_2(hidden_size), 1024 if rows == 1 else 256),
                num_warps=num_warps, num_stages=2, **launch_options(device, rows),
            )
            if warmup:
                return decode_layer_kernel.warmup(*args, grid=(grid,), **constants)
            return decode_layer_kernel[(grid,)](*args, **constants)

        if programs is None and sms is not None:
            key = (rows > 1, hidden_size, inter, heads, kv, d, x.dtype, k_cache.dtype, block_size, residual is None,
                   self.q_norm is None, max_seqlen_k, num_splits, prefetch, num_warps, timestamps is None, device)
            if key not in _PER_SM:
                _PER_SM[key] = self._programs_per_sm(launch, sms, device, num_warps)
            programs = sms * _PER_SM[key]
        launch(programs or 1, False)
        return out, r2
