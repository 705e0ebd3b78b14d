"""Launch configurations of the FP8-weight skinny GEMM (nv_kernels.fp8_skinny_gemm): `FP8_TUNED_CONFIGS`,
measured per shape by `benchmarks/bench_small_gemm.py --fp8 --table` on the GPU, and `choose_fp8_config`, which
reads them and otherwise starts from the bf16 skinny GEMM's choice for the same shape (nv_kernels.skinny_gemm_config).

Why the bf16 choice is the starting point: a configuration fixes the tile in elements ([BLOCK_N, BLOCK_K]
weights per program and step). On the CUDA cores (the GEMV of one row) registers and work per element are the
same whether the codes are e4m3 or bf16 (both widened to fp32), so a tile that fit and kept every SM streaming in
bf16 does in FP8, with half the bytes in flight. On the tensor cores the FP8 kernel takes one 128-input scale
block per K step, the weight tile as the MMA's first operand widened in registers (see its kernel), so
`fit_to_scale_blocks` sets BLOCK_K 128 there; it also keeps each tile inside one row of 128 x 128 scale blocks
(BLOCK_N divides 128, and with gated the up offset too).
"""
from __future__ import annotations

import functools

import torch

from nv_kernels.skinny_gemm_config import DEFAULT_NUM_SMS, TUNED_CONFIGS, SkinnyGemmConfig, heuristic_config, m_bucket
from nv_kernels.sm_count import cuda_sm_count

SCALE_BLOCK = 128

# (weight rows N_w, K, M bucket, gated) -> the measured best configuration; shapes not listed start from the
# bf16 skinny GEMM's table or heuristic (see above). The Qwen3-8B projections at 1, 4 and 16 rows, measured on one
# H100 (2026-12-07, `bench_small_gemm.py --fp8 --models 8b --m 4,16,1 --table`), us per call against the derived
# configuration and the bf16 skinny GEMM: one row qkv 11.5 (12.7; bf16 19.0), o 9.0 (9.2; 13.5), gate_up 39.2
# (51.0; 65.8), down 26.4 (same; 36.8); at 4 and 16 rows the tensor-core tiles below take qkv from 32.7 to 20.4,
# o 17.9 to 15.6, down 43.6 to 38.5 (bf16 20.1, 15.4, 37.6) and gate_up stays at 55.5 (bf16 68.4).
# Those 4- and 16-row tiles were x-first (x as the MMA's first operand, 32 columns); the weight-first kernel
# takes `weight_first_config` at 2 rows and more instead, until it is measured.
FP8_TUNED_CONFIGS: dict[tuple[int, int, int, bool], SkinnyGemmConfig] = {
    (6144, 4096, 1, False): SkinnyGemmConfig(block_n=8, block_k=4096, split_k=1, num_warps=8, num_stages=1,
                                             use_dot=False),                                  # 8B qkv
    (4096, 4096, 1, False): SkinnyGemmConfig(block_n=4, block_k=4096, split_k=1, num_warps=8, num_stages=1,
                                             use_dot=False),                                  # 8B o
    (24576, 4096, 1, True): SkinnyGemmConfig(block_n=8, block_k=4096, split_k=1, num_warps=8, num_stages=1,
                                             use_dot=False),                                  # 8B gate_up
    (4096, 12288, 1, False): SkinnyGemmConfig(block_n=32, block_k=512, split_k=2, num_warps=4, num_stages=2,
                                              use_dot=False),                                 # 8B down
}


def fit_to_scale_blocks(config: SkinnyGemmConfig, n_out: int, gated: bool) -> SkinnyGemmConfig:
    """config with BLOCK_N cut to divide 128 and, gated, the up offset n_out (the largest power of two dividing
    both), so that a tile's gate rows and its up rows each lie in one row of scale blocks; the tensor cores take
    tiles of 16 rows or more (a narrower tile takes the CUDA-core product) and one scale block per K step
    (BLOCK_K 128)."""
    block_n = min(config.block_n, SCALE_BLOCK)
    if gated:
        block_n = min(block_n, n_out & -n_out) if n_out > 0 else block_n   # n_out & -n_out: its largest 2^j factor
    use_dot = config.use_dot and block_n >= 16
    block_k = SCALE_BLOCK if use_dot else config.block_k
    if block_n == config.block_n and use_dot == config.use_dot and block_k == config.block_k:
        return config
    return SkinnyGemmConfig(block_n=block_n, block_k=block_k, split_k=config.split_k,
                            num_warps=config.num_warps, num_stages=config.num_stages, use_dot=use_dot)


@functools.lru_cache(maxsize=1024)
def _derived_config(weight_rows: int, k: int, bucket: int, gated: bool, num_sms: int) -> SkinnyGemmConfig:
    base = TUNED_CONFIGS.get((weight_rows, k, bucket, gated))   # None also where torch beat the bf16 kernel
    if base is None:
        base = heuristic_config(weight_rows, k, bucket, gated, num_sms)
    return fit_to_scale_blocks(base, weight_rows // 2 if gated else weight_rows, gated)


@functools.lru_cache(maxsize=1024)
def weight_first_config(weight_rows: int, k: int, gated: bool, num_sms: int) -> SkinnyGemmConfig:
    """The tensor-core launch: 128 weight rows (64 gated: its gate and up tiles, 16 rows of x, fit 4 warps' registers
    without spilling) by one scale block. The MMA's rows are weight rows, so each of the 4 warps takes its own and
    none converts another's codes. K is split until there are about four programs per SM, with at least two scale
    blocks per split; fitted to the scale blocks."""
    n_out = weight_rows // 2 if gated else weight_rows
    block_n = SCALE_BLOCK // 2 if gated else SCALE_BLOCK
    column_blocks = -(-n_out // block_n)
    k_blocks = -(-k // SCALE_BLOCK)
    split_k = max(1, min(-(-4 * num_sms // column_blocks), k_blocks // 2))
    config = SkinnyGemmConfig(block_n=block_n, block_k=SCALE_BLOCK, split_k=split_k, num_warps=4, num_stages=3,
                              use_dot=True)
    return fit_to_scale_blocks(config, n_out, gated)


def choose_fp8_config(weight_rows: int, k: int, m: int, gated: bool, device: torch.device | None = None
                      ) -> SkinnyGemmConfig:
    """The measured FP8 configuration of this shape and M bucket, else: 2 rows and more the tensor cores'
    `weight_first_config`, one row the bf16 skinny GEMM's (tuned, else its heuristic's), fitted to the scale
    blocks."""
    bucket = m_bucket(m)
    n_out = weight_rows // 2 if gated else weight_rows
    tuned = FP8_TUNED_CONFIGS.get((weight_rows, k, bucket, gated))
    if tuned is not None:
        return fit_to_scale_blocks(tuned, n_out, gated)
    num_sms = (cuda_sm_count(device) if device is not None else None) or DEFAULT_NUM_SMS
    if bucket > 1:
        return weight_first_config(weight_rows, k, gated, num_sms)
    return _derived_config(weight_rows, k, bucket, gated, num_sms)
