"""benchmarks/bench_w8a8_gemm.py: its launch list starts with the layers' launch, asks for two groups a step only
where K allows, and every launch it times computes the product (the kernel interpreted on CPU)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from repo_scripts import ROOT, load_script

from nv_kernels.fp8_block_gemm import fp8_block_gemm_torch, gemm_on_codes, quantize_fp8_block, tile_shape
from nv_kernels.testing import interpreted_triton_modules


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "benchmarks"))     # its neighbours, as when run from the repository root
        return load_script("benchmarks/bench_w8a8_gemm.py")


@pytest.fixture(scope="module")
def interpreted() -> Iterator[None]:
    with interpreted_triton_modules("nv_kernels.fp8_act_quant_kernel", "nv_kernels.fp8_block_gemm_kernel"):
        yield


def test_the_layers_launch_comes_first(bench) -> None:
    for m, n, k in [(256, 6144, 4096), (8192, 4096, 12288), (300, 200, 384)]:
        launches = bench.launch_candidates(m, n, k, 132)
        assert tuple(launches[0])[:4] == tile_shape(m, n, 132) and launches[0].paired == (k % 256 == 0)
        assert len(set(launches)) == len(launches)
        assert all(not launch.paired for launch in launches) == (k % 256 != 0)
    assert len(bench.launch_candidates(256, 6144, 4096, 132, full=True)) > len(bench.LAUNCHES)


@pytest.mark.usefixtures("interpreted")
def test_every_launch_computes_the_product(bench) -> None:
    from nv_kernels.fp8_block_gemm import quantize_activations_triton

    gen = torch.Generator().manual_seed(0)
    m, n, k = 70, 256, 512
    x = torch.randn(m, k, generator=gen).bfloat16()
    w_q, w_scale = quantize_fp8_block(torch.randn(n, k, generator=gen) * k ** -0.5)
    want = fp8_block_gemm_torch(x.float(), w_q, w_scale)
    x_q, x_scale = quantize_activations_triton(x)
    for launch in bench.launch_candidates(m, n, k, 132):
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        gemm_on_codes(x_q, x_scale, w_q, w_scale, None, y, launch)
        assert ((y.float() - want).norm() / want.norm()).item() < 1e-2, launch
