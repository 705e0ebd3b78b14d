"""Launch configurations of the FP8-weight skinny GEMM (nv_kernels.fp8_skinny_gemm): `FP8_TUNED_CONFIGS`,
measured per shape by `benchmarks/bench_small_gemm.py --fp8 --table` on the GPU, and `choose_fp8_config`, which
reads them and otherwise starts from the bf16 skinny GEMM's choice for the same shape (nv_kernels.skinny_gemm_config).

Why the bf16 choice is the starting point: a configuration fixes the tile in elements ([BLOCK_N, BLOCK_K]
weights per program and step). On the CUDA cores (the GEMV of one row) registers and work per element are the
same whether the codes are e4m3 or bf16 (both widened to fp32), so a tile that fit and kept every SM streaming in
bf16 does in FP8, with half the bytes in flight. On the tensor cores the bf16 kernel feeds tl.dot from shared
memory, while the FP8 tile is widened to bf16 in registers: compiled for sm_90, BLOCK_K 256 took 106-255
registers per thread where bf16 takes 48-80 (gate_up spilled), BLOCK_K 128 takes 63-128; so the tensor-core
path halves BLOCK_K (to at most 128) and pipelines one stage deeper. `fit_to_scale_blocks` then keeps each tile
inside one row of 128 x 128 scale blocks (BLOCK_N divides 128, and with gated the up offset too).
"""
from __future__ import annotations

import functools

import torch

from nv_kernels.skinny_gemm_config import DEFAULT_NUM_SMS, TUNED_CONFIGS, SkinnyGemmConfig, heuristic_config, m_bucket
from nv_kernels.sm_count import cuda_sm_count

SCALE_BLOCK = 128

# (weight rows N_w, K, M bucket, gated) -> the measured best configuration; shapes not listed start from the
# bf16 skinny GEMM's table or heuristic (see above).
FP8_TUNED_CONFIGS: dict[tuple[int, int, int, bool], SkinnyGemmConfig] = {}


def fit_to_scale_blocks(config: SkinnyGemmConfig, n_out: int, gated: bool) -> SkinnyGemmConfig:
    """config with BLOCK_N cut to divide 128 and, gated, the up offset n_out (the largest power of two dividing
    both), so that a tile's gate rows and its up rows each lie in one row of scale blocks; tl.dot needs 16
    columns, so a narrower tile takes the CUDA-core product."""
    block_n = min(config.block_n, SCALE_BLOCK)
    if gated:
        block_n = min(block_n, n_out & -n_out) if n_out > 0 else block_n   # n_out & -n_out: its largest 2^j factor
    use_dot = config.use_dot and block_n >= 16
    if block_n == config.block_n and use_dot == config.use_dot:
        return config
    return SkinnyGemmConfig(block_n=block_n, block_k=config.block_k, split_k=config.split_k,
                            num_warps=config.num_warps, num_stages=config.num_stages, use_dot=use_dot)


@functools.lru_cache(maxsize=1024)
def _derived_config(weight_rows: int, k: int, bucket: int, gated: bool, num_sms: int) -> SkinnyGemmConfig:
    base = TUNED_CONFIGS.get((weight_rows, k, bucket, gated))   # None also where torch beat the bf16 kernel
    if base is None:
        base = heuristic_config(weight_rows, k, bucket, gated, num_sms)
    if base.use_dot and base.block_k > 128:   # the widened tile in registers (see above)
        base = SkinnyGemmConfig(block_n=base.block_n, block_k=128, split_k=base.split_k,
                                num_warps=base.num_warps, num_stages=base.num_stages + 1, use_dot=True)
    return fit_to_scale_blocks(base, weight_rows // 2 if gated else weight_rows, gated)


def choose_fp8_config(weight_rows: int, k: int, m: int, gated: bool, device: torch.device | None = None
                      ) -> SkinnyGemmConfig:
    """The measured FP8 configuration of this shape and M bucket, else the bf16 skinny GEMM's (tuned, else its
    heuristic's), fitted to the scale blocks."""
    bucket = m_bucket(m)
    n_out = weight_rows // 2 if gated else weight_rows
    tuned = FP8_TUNED_CONFIGS.get((weight_rows, k, bucket, gated))
    if tuned is not None:
        return fit_to_scale_blocks(tuned, n_out, gated)
    num_sms = (cuda_sm_count(device) if device is not None else None) or DEFAULT_NUM_SMS
    return _derived_config(weight_rows, k, bucket, gated, num_sms)
