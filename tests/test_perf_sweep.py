"""benchmarks/perf_sweep.py: its flags parse off a GPU, and runs with another KV cache write files of their own."""
from __future__ import annotations

from pathlib import Path

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def perf_sweep():
    return load_script("benchmarks/perf_sweep.py")


def test_kv_cache_dtype_and_prefill_profile_parse(perf_sweep) -> None:
    args = perf_sweep.build_parser().parse_args(["--model", "m", "--kv-cache-dtype", "fp8", "--prefill-profile"])
    assert (args.kv_cache_dtype, args.prefill_profile, args.graph_profile) == ("fp8", True, False)
    default = perf_sweep.build_parser().parse_args(["--model", "m"])
    assert (default.kv_cache_dtype, default.prefill_profile) == ("auto", False)
    with pytest.raises(SystemExit):
        perf_sweep.build_parser().parse_args(["--model", "m", "--kv-cache-dtype", "int8"])


def test_fp8_files_sit_beside_the_default_ones(perf_sweep, tmp_path: Path) -> None:
    # one output directory holds a bf16 and an FP8 run side by side
    assert perf_sweep.output_path(tmp_path, "profile.md", "auto") == tmp_path / "profile.md"
    assert perf_sweep.output_path(tmp_path, "profile.md", "fp8") == tmp_path / "profile-fp8.md"
    assert perf_sweep.output_path(tmp_path, "graph_trace.json", "fp8_e5m2") == tmp_path / "graph_trace-fp8_e5m2.json"
