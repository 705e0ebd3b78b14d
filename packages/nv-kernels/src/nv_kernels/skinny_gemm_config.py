"""Launch configurations of the skinny GEMM (nv_kernels.skinny_gemm): `SkinnyGemmConfig`, the measured
`TUNED_CONFIGS` (keyed by the weight shape and the M bucket, filled from benchmarks/bench_small_gemm.py on the
GPU) and `choose_config`, which reads them and falls back to `heuristic_config`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from nv_kernels.fused_dispatch import next_power_of_2
from nv_kernels.sm_count import cuda_sm_count

DEFAULT_NUM_SMS = 132                          # H100 / H200; the heuristic's target off CUDA (interpreter)


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """One launch configuration. block_n: output columns per program (>= 16 with use_dot); block_k: the K
    step of the loop; split_k: programs per column block along K (the last to finish reduces); use_dot: tl.dot
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
# Filled from `benchmarks/bench_small_gemm.py --table` on the GPU; shapes not listed use the heuristic.
# Measured on an H200 (2026-12-01, benchmarks/bench_small_gemm.py, weights read from HBM): the fastest
# configuration per (weight rows, K, M bucket, gated), or None where torch's GEMM measured faster (the
# layers then keep F.linear). The gated rows stay on the skinny GEMM even where F.linear + SiLU-and-mul
# timed slightly faster alone: inside the decode step cuBLAS picked a 12.8 us kernel for that shape.
# M = 1 (dependent launch, CUDA-core GEMV): one K tile per program and no split (ONE_TILE in
# skinny_gemm_kernel), chosen with benchmarks/bench_gemm_chain.py: the four projections of every layer chained
# in one CUDA graph, the norms fused as the model runs them. Qwen3-0.6B: 23.3 us per layer with the K-loop
# configurations these replaced, 14.1 with these; Qwen3-8B (no norm fused at K 4096): 107.2 -> 96.6 us per
# layer, down keeping its split (H200, 2026-12-02).
_C = SkinnyGemmConfig   # (block_n, block_k, split_k, num_warps, num_stages, use_dot)
TUNED_CONFIGS: dict[tuple[int, int, int, bool], SkinnyGemmConfig | None] = {
    # key: (weight rows, K, M bucket, gated); comment: shape, torch us / best skinny us
    (4096, 1024, 1, False): _C(8, 1024, 1, 2, 1, False),  # 0.6b qkv: one tile
    (4096, 1024, 2, False): None,  # 0.6b qkv: 5.35 / 5.56
    (4096, 1024, 4, False): None,  # 0.6b qkv: 5.38 / 5.62
    (4096, 1024, 8, False): None,  # 0.6b qkv: 5.37 / 5.58
    (4096, 1024, 16, False): None,  # 0.6b qkv: 5.36 / 5.58
    (1024, 2048, 1, False): _C(4, 2048, 1, 4, 1, False),  # 0.6b o: one tile
    (1024, 2048, 2, False): _C(32, 128, 4, 4, 3, True),  # 0.6b o: 12.77 / 5.75
    (1024, 2048, 4, False): _C(32, 128, 4, 4, 3, True),  # 0.6b o: 8.60 / 5.75
    (1024, 2048, 8, False): _C(32, 256, 4, 4, 3, True),  # 0.6b o: 5.91 / 5.83
    (1024, 2048, 16, False): _C(32, 256, 4, 4, 3, True),  # 0.6b o: 5.92 / 5.79
    (6144, 1024, 1, True): _C(4, 1024, 1, 2, 1, False),  # 0.6b gate_up: one tile
    (6144, 1024, 2, True): _C(32, 256, 1, 4, 3, True),  # 0.6b gate_up: 7.46 / 7.97
    (6144, 1024, 4, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.50 / 8.05
    (6144, 1024, 8, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.40 / 7.99
    (6144, 1024, 16, True): _C(32, 512, 1, 4, 3, True),  # 0.6b gate_up: 7.66 / 8.00
    (1024, 3072, 1, False): _C(4, 4096, 1, 4, 1, False),  # 0.6b down: one tile (K 3072 in a masked 4096)
    (1024, 3072, 2, False): _C(32, 128, 8, 4, 3, True),  # 0.6b down: 7.43 / 6.57
    (1024, 3072, 4, False): _C(32, 128, 8, 4, 3, True),  # 0.6b down: 7.54 / 6.52
    (1024, 3072, 8, False): _C(32, 256, 4, 4, 3, True),  # 0.6b down: 7.58 / 6.45
    (1024, 3072, 16, False): _C(32, 256, 4, 4, 3, True),  # 0.6b down: 7.71 / 6.51
    (6144, 4096, 1, False): _C(4, 4096, 1, 4, 1, False),  # 8b qkv: one tile
    (6144, 4096, 2, False): None,  # 8b qkv: 16.30 / 16.39
    (6144, 4096, 4, False): None,  # 8b qkv: 16.28 / 16.46
    (6144, 4096, 8, False): None,  # 8b qkv: 16.04 / 16.58
    (6144, 4096, 16, False): None,  # 8b qkv: 16.13 / 16.70
    (4096, 4096, 1, False): _C(4, 4096, 1, 4, 1, False),  # 8b o: one tile
    (4096, 4096, 2, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.42 / 12.30
    (4096, 4096, 4, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.51 / 12.26
    (4096, 4096, 8, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.37 / 12.23
    (4096, 4096, 16, False): _C(32, 256, 2, 4, 3, True),  # 8b o: 13.62 / 12.32
    (24576, 4096, 1, True): _C(2, 4096, 1, 4, 1, False),  # 8b gate_up: one tile
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


def m_bucket(m: int) -> int:
    """The M bucket of m rows (the next power of two): the rows a tuned configuration is measured for."""
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
    tuned = TUNED_CONFIGS.get((weight_rows, k, m_bucket(m), gated))
    if tuned is not None:          # None (torch measured faster) only reaches here through a direct call
        return tuned
    num_sms = (cuda_sm_count(device) if device is not None else None) or DEFAULT_NUM_SMS
    return heuristic_config(weight_rows, k, m, gated, num_sms)
