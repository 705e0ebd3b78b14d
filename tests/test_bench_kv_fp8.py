"""benchmarks/bench_kv_fp8.py: its flags parse off a GPU, and decode-bw --sweep's grid holds today's FP8 launch."""
from __future__ import annotations

from pathlib import Path

import pytest
from repo_scripts import load_script

from nv_kernels.decode_tuning import choose_num_splits, choose_tile

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kv_fp8.py"


@pytest.fixture(scope="module")
def bench_kv_fp8():
    return load_script("benchmarks/bench_kv_fp8.py")


def test_decode_bw_sweep_parses(bench_kv_fp8) -> None:
    args = bench_kv_fp8.build_parser().parse_args(["decode-bw", "--block-size", "32", "--sweep"])
    assert (args.what, args.block_size, args.sweep) == ("decode-bw", 32, True)
    assert bench_kv_fp8.build_parser().parse_args(["decode-bw"]).sweep is False


@pytest.mark.parametrize("num_sms", [78, 132])            # H100 PCIe ... H100 SXM / H200
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize(("batch", "context"), [(256, 1024), (64, 4096)])   # decode-bw's shapes
def test_sweep_holds_todays_launch(bench_kv_fp8, num_sms: int, block_size: int, batch: int, context: int) -> None:
    # today's launch: decode_attention's defaults on an FP8 cache (Qwen3-0.6B heads: Hkv 8, D 128)
    today = (choose_num_splits(batch, 8, context, num_sms, fp8=True), choose_tile(block_size, 128, fp8=True), 4, 2)
    assert today in bench_kv_fp8.FP8_SWEEP


def test_ragged_contexts_end_in_partial_fp8_tiles(bench_kv_fp8) -> None:
    # decode-bw's even contexts are whole FP8 tiles; --ragged ones mostly end mid-tile, as the headline's do
    tile = choose_tile(64, 128, fp8=True)
    assert bench_kv_fp8.decode_lengths(256, 1024, ragged=False) == [1024] * 256
    assert all(length % tile == 0 for length in bench_kv_fp8.decode_lengths(64, 4096, ragged=False))
    lengths = bench_kv_fp8.decode_lengths(256, 1024, ragged=True)
    assert lengths == bench_kv_fp8.decode_lengths(256, 1024, ragged=True)   # seeded: runs compare
    assert min(lengths) >= 512 and max(lengths) <= 1536
    assert abs(sum(lengths) / len(lengths) - 1024) < 0.05 * 1024
    assert sum(length % tile != 0 for length in lengths) > 0.9 * len(lengths)


def test_decode_bw_ragged_parses(bench_kv_fp8) -> None:
    assert bench_kv_fp8.build_parser().parse_args(["decode-bw", "--ragged"]).ragged is True
    assert bench_kv_fp8.build_parser().parse_args(["decode-bw"]).ragged is False


def test_decode_bw_shapes_and_tiles_parse(bench_kv_fp8) -> None:
    parser = bench_kv_fp8.build_parser()
    args = parser.parse_args(["decode-bw", "--sweep", "--shapes", "32x2048, 128x1024", "--tiles", "128"])
    assert (args.shapes, args.tiles) == (((32, 2048), (128, 1024)), (128,))
    defaults = parser.parse_args(["decode-bw"])
    assert defaults.shapes == ((256, 1024), (64, 4096)) and defaults.tiles is None
    for bad in (["--shapes", "256"], ["--shapes", "0x1024"], ["--tiles", "96"], ["--tiles", ""]):
        with pytest.raises(SystemExit):
            parser.parse_args(["decode-bw", *bad])


def test_best_per_split_keeps_the_fastest_launch_of_each_split_count(bench_kv_fp8) -> None:
    def launch(splits: int, tile: int) -> dict:
        return {"num_splits": splits, "tile": tile, "num_warps": 4, "num_stages": 2}

    rows = [(0.30, launch(1, 256)), (0.21, launch(4, 128)), (0.25, launch(1, 128)), (0.22, launch(2, 128)),
            (0.24, launch(4, 64))]
    assert bench_kv_fp8.best_per_split(rows) == [(0.25, launch(1, 128)), (0.22, launch(2, 128)),
                                                 (0.21, launch(4, 128))]


def test_long_runs_both_caches_unless_told(bench_kv_fp8) -> None:
    parser = bench_kv_fp8.build_parser()
    assert parser.parse_args(["long"]).kv_cache_dtypes == ("auto", "fp8")
    assert parser.parse_args(["long", "--kv-cache-dtypes", "fp8"]).kv_cache_dtypes == ("fp8",)
    with pytest.raises(SystemExit):                     # argparse's usage error, before any engine starts
        parser.parse_args(["long", "--kv-cache-dtypes", "fp8,bf17"])
