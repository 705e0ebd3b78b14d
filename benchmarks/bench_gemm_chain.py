"""A decode step's projections as the model chains them, timed on the GPU: the qkv, o, gate_up and down GEMMs of
every layer of a Qwen3 shape (distinct random weights per layer, so each reads HBM), M rows, one CUDA graph of
all layers; microseconds per layer. Isolated GEMM timings (benchmarks/bench_small_gemm.py) miss what a chain shows
at small M: programmatic dependent launch overlaps a kernel with the previous one, so a configuration that loads
its weights before its wait (one K tile per program) gains there and nowhere else.

Prints the configurations `choose_config` picks today, then a greedy search: each projection in turn tries
its candidates with the others at the best so far, keeping one that is faster by more than --keep-us. Every
candidate is first checked against torch's path on fresh inputs (relative error printed). For the 0.6B shape the
add + RMSNorm before qkv and gate_up is fused into the GEMM as the layers do at up to 8 rows (the norm kernel
plus the GEMM above); the 8B shape has no norm fused (K 4,096).

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/bench_gemm_chain.py [--shape 0.6b|8b] [--m 1]
        [--no-pdl] [--keep-us 0.05]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from bench_small_gemm import graph_us

from nv_kernels import dependent_launch
from nv_kernels.fused_norm import rms_norm_triton
from nv_kernels.skinny_gemm import (
    NORM_FUSION_MAX_M,
    skinny_gemm,
    skinny_gemm_torch,
    skinny_norm_gemm,
    skinny_norm_gemm_torch,
)
from nv_kernels.skinny_gemm_config import SkinnyGemmConfig, choose_config
from nv_kernels.testing import relative_error

C = SkinnyGemmConfig
DTYPE = torch.bfloat16
EPS = 1e-6
# shape -> (layers, hidden, q width, {projection: (weight rows, K, gated)})
SHAPES = {
    "0.6b": (28, 1024, 2048, {"qkv": (4096, 1024, False), "o": (1024, 2048, False), "gate_up": (6144, 1024, True),
                              "down": (1024, 3072, False)}),
    "8b": (36, 4096, 4096, {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (24576, 4096, True),
                            "down": (4096, 12288, False)}),
}
# (block_n, block_k, split_k, num_warps, num_stages, use_dot): one K tile per program at M = 1 on the CUDA cores
ONE_TILE_CANDIDATES = {
    "0.6b": {"qkv": [C(16, 1024, 1, 4, 1, False), C(8, 1024, 1, 2, 1, False), C(4, 1024, 1, 4, 1, False)],
             "o": [C(16, 512, 4, 4, 1, False), C(8, 2048, 1, 8, 1, False), C(4, 2048, 1, 4, 1, False)],
             "gate_up": [C(16, 1024, 1, 4, 1, False), C(8, 1024, 1, 4, 1, False), C(4, 1024, 1, 2, 1, False)],
             "down": [C(16, 1024, 3, 4, 1, False), C(8, 4096, 1, 8, 1, False), C(4, 4096, 1, 4, 1, False)]},
    "8b": {"qkv": [C(4, 4096, 1, 4, 1, False), C(8, 4096, 1, 8, 1, False), C(8, 2048, 2, 4, 1, False)],
           "o": [C(4, 4096, 1, 4, 1, False), C(8, 4096, 1, 8, 1, False), C(8, 2048, 2, 4, 1, False)],
           "gate_up": [C(4, 4096, 1, 8, 1, False), C(2, 4096, 1, 4, 1, False), C(8, 1024, 4, 4, 1, False)],
           "down": [C(4, 4096, 3, 4, 1, False), C(2, 4096, 3, 2, 1, False), C(4, 2048, 6, 2, 1, False)]},
}
# M > 1 on the tensor cores, one K tile per program. On the H200 (2026-12-02), with dependent launch forced on: 16
# rows 26.5 us per layer against 28.2 today (norm kernels, no dependent launch), 4 rows 29.1 against 27.5.
DOT_CANDIDATES = {"qkv": [C(16, 1024, 1, 8, 1, True), C(32, 1024, 1, 8, 1, True)],
                  "o": [C(16, 1024, 2, 4, 1, True), C(16, 2048, 1, 4, 1, True)],
                  "gate_up": [C(16, 1024, 1, 4, 1, True), C(32, 1024, 1, 8, 1, True)],
                  "down": [C(16, 1024, 3, 4, 1, True), C(16, 2048, 2, 8, 1, True)]}
Configs = dict[str, SkinnyGemmConfig]


class GemmChain:
    """The projections of every layer of one shape at M rows, chained as a decode step chains them."""

    def __init__(self, shape: str, m: int, device: str = "cuda") -> None:
        self.layers, hidden, self.q_width, self.projections = SHAPES[shape]
        self.m, self.fuse_norm, self.device = m, shape == "0.6b" and m <= NORM_FUSION_MAX_M, device
        gen = torch.Generator(device).manual_seed(0)

        def weight(rows: int, k: int) -> torch.Tensor:
            return (torch.randn(rows, k, generator=gen, device=device) * k ** -0.5).to(DTYPE)

        self.weights = [{name: weight(rows, k) for name, (rows, k, _) in self.projections.items()}
                        for _ in range(self.layers)]
        self.norm = (torch.rand(hidden, generator=gen, device=device) + 0.5).to(DTYPE)
        self.x = torch.randn(m, hidden, generator=gen, device=device).to(DTYPE)
        self.residual = torch.randn(m, hidden, generator=gen, device=device).to(DTYPE)

    def today(self) -> Configs:
        return {name: choose_config(rows, k, self.m, gated) for name, (rows, k, gated) in self.projections.items()}

    def _normed_gemm(self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, gated: bool,
                     config: SkinnyGemmConfig) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fuse_norm:
            return skinny_norm_gemm(x, residual, self.norm, EPS, w, gated=gated, config=config)
        normed, h = rms_norm_triton(x, self.norm, EPS, residual)
        return skinny_gemm(normed, w, gated=gated, config=config), h

    def run(self, configs: Configs) -> torch.Tensor:
        x, residual = self.x, self.residual
        for w in self.weights:
            qkv, h = self._normed_gemm(x, residual, w["qkv"], False, configs["qkv"])
            o = skinny_gemm(qkv[:, :self.q_width], w["o"], config=configs["o"])
            act, residual = self._normed_gemm(o, h, w["gate_up"], True, configs["gate_up"])
            x = skinny_gemm(act, w["down"], config=configs["down"])
        return x

    def us_per_layer(self, configs: Configs) -> float:
        """Median over replays of the whole chain captured in one CUDA graph, per layer."""
        return graph_us([lambda: self.run(configs)]) / self.layers

    def error(self, name: str, config: SkinnyGemmConfig) -> float:
        """Relative error of one projection against torch's path in bf16, fresh inputs."""
        rows, k, gated = self.projections[name]
        w = self.weights[0][name]
        x = torch.randn(self.m, k, device=self.device).to(DTYPE)
        if name in ("qkv", "gate_up") and self.fuse_norm:
            residual = torch.randn_like(x)
            out, _ = skinny_norm_gemm(x, residual, self.norm, EPS, w, gated=gated, config=config)
            return relative_error(out, skinny_norm_gemm_torch(x, residual, self.norm, EPS, w, gated=gated)[0])
        return relative_error(skinny_gemm(x, w, gated=gated, config=config), skinny_gemm_torch(x, w, gated=gated))


def greedy(chain: GemmChain, candidates: dict[str, list[SkinnyGemmConfig]], keep_us: float,
           say: Callable[[str], None]) -> tuple[Configs, float]:
    best = chain.today()
    best_us = chain.us_per_layer(best)
    for name, configs in candidates.items():
        for config in configs:
            trial = {**best, name: config}
            err = chain.error(name, config)
            us = chain.us_per_layer(trial)
            say(f"  {name:8s} {config}: {us:7.2f} us per layer, relative error {err:.1e}")
            if us < best_us - keep_us:
                best, best_us = trial, us
    return best, best_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    parser.add_argument("--m", type=int, default=1, help="rows (tokens) of the decode step, at most 16")
    parser.add_argument("--no-pdl", action="store_true", help="without programmatic dependent launch")
    parser.add_argument("--keep-us", type=float, default=0.05, help="a candidate must win by this much")
    args = parser.parse_args()
    # dependent launch as the engine runs it (rows up to its limit), or forced on for every M here
    dependent_launch.set_dependent_launch(not args.no_pdl)
    dependent_launch.MAX_TOKENS = max(dependent_launch.MAX_TOKENS, args.m)
    chain = GemmChain(args.shape, args.m)
    today = chain.today()
    print(f"{args.shape}, M = {args.m}, dependent launch {'off' if args.no_pdl else 'on'}", flush=True)
    print(f"today: {chain.us_per_layer(today):.2f} us per layer {today}", flush=True)
    candidates = ONE_TILE_CANDIDATES[args.shape] if args.m == 1 else DOT_CANDIDATES
    best, best_us = greedy(chain, candidates, args.keep_us, lambda line: print(line, flush=True))
    print(f"best: {best_us:.2f} us per layer {best}", flush=True)


if __name__ == "__main__":
    main()
