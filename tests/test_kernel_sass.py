"""scripts/dev/kernel_sass.py: nv's kernels compiled for sm_90 without a GPU, and what their loops hold. Run as
the command line runs it: in a process of its own, with Triton's interpreter off (the tests' session turns it on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "dev" / "kernel_sass.py"


def report(*argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip("this triton build has no sm_90 compiler")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_int4_gemv_loop_multiplies_on_the_cuda_cores(tmp_path) -> None:
    sass = tmp_path / "int4.sass"
    r = report("int4-gemv", "--gemv", "--block-n", "64", "--sass", str(sass))
    assert 0 < r["registers"] <= 255 and r["instructions"] > 0 and "FFMA" in sass.read_text()
    (loop,) = r["loops"]                                # the K loop (one group of 128 inputs per pass)
    assert loop["mix"]["FFMA"] >= 64                    # a multiply-add per code at least: 64 codes per thread
    assert loop["per_element"] == pytest.approx(loop["instructions"] / 64, abs=0.01)


def test_int4_pairs_loop_dequantizes_two_codes_per_instruction() -> None:
    """The one-row launch the engine takes: codes made into 16-bit float pairs (one packed fma per pair) and fed to
    the tensor cores where they were made, at well under half the GEMV's instructions per code."""
    pairs, gemv = report("int4-gemv"), report("int4-gemv", "--gemv")
    loop = pairs["loops"][0]                            # the K loop; then the last split's reduction of the partials
    codes_per_thread = 128                              # 128 columns x 128 inputs over 128 threads
    assert loop["mix"].get("HFMA2", 0) + loop["mix"].get("HADD2", 0) == codes_per_thread // 2   # ptxas: fma x 1 = add
    assert loop["mix"].get("HMMA", 0) + loop["mix"].get("HGMMA", 0) > 0
    assert loop["per_element"] < 0.5 * gemv["loops"][0]["per_element"]


def test_decode_loops_convert_fp8_and_load_whole_vectors(tmp_path) -> None:
    """bf16 and FP8 caches: two loops (whole tiles, then the partial one), both on the tensor cores; FP8 converts
    e4m3 pairs to f16 pairs. Both caches' tiles load in 16-byte copies, never a byte or two at a time: the FP8 V
    cache is token-major with a token stride of 1, which the launcher makes a constant (as the tool does)."""
    loads = {}
    for name, argv in (("bf16", []), ("fp8", ["--fp8"])):
        sass = tmp_path / f"{name}.sass"
        r = report("decode", *argv, "--sass", str(sass))
        assert len(r["loops"]) == 2 and all(loop["mix"].get("HMMA", 0) > 0 for loop in r["loops"])
        assert all((loop["mix"].get("F2FP", 0) > 0) == (name == "fp8") for loop in r["loops"])
        loads[name] = sass.read_text()
    for text in loads.values():
        assert "LDGSTS.E.BYPASS.128" in text and "LDG.E.U8" not in text and "LDG.E.U16" not in text


def test_decode_query_tile_rows_are_a_launch_choice() -> None:
    """--group-pad: the program's 2 query heads padded to 8 rows instead of 16 compile for sm_90; the tensor-core
    instructions stay (an MMA has 16 rows; Triton pads the tile), the rest of the loop is a different program."""
    rows16, rows8 = (report("decode", "--fp8", "--group-pad", str(pad)) for pad in (16, 8))
    whole16, whole8 = rows16["loops"][0], rows8["loops"][0]
    assert whole8["mix"]["HMMA"] == whole16["mix"]["HMMA"]
    assert whole8["instructions"] != whole16["instructions"]
