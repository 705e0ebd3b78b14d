"""ParallelTritonCompile: inside the block a Triton launch only compiles (on a pool of threads) and runs nothing;
after the block the kernels run, already compiled. Off CUDA the block does nothing."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl

from nv_kernels.fused_dispatch import triton_jit
from nv_kernels.jit_watch import TritonCompileWatch
from nv_kernels.parallel_compile import ParallelTritonCompile

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@triton_jit
def _add_constant(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ADD: tl.constexpr, SALT: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + ADD + SALT * 0, mask=mask)


def test_off_cuda_nothing_is_switched():
    with ParallelTritonCompile(torch.device("cpu")) as compile_pass:
        assert not compile_pass.active
    assert compile_pass.requested == 0


def test_switch_read_as_the_block_opens(monkeypatch):
    """NV_PARALLEL_COMPILE is read when a block opens, not at import: a bad value set now raises there, naming it."""
    monkeypatch.setenv("NV_PARALLEL_COMPILE", "sometimes")
    with pytest.raises(ValueError, match="NV_PARALLEL_COMPILE"), ParallelTritonCompile(torch.device("cpu")):
        pass
    monkeypatch.setenv("NV_PARALLEL_COMPILE", "0")
    with ParallelTritonCompile(torch.device("cpu")) as compile_pass:
        assert not compile_pass.active


def test_ahead_logs_a_bad_switch_and_runs_nothing(monkeypatch, caplog):
    monkeypatch.setenv("NV_PARALLEL_COMPILE", "sometimes")
    ran: list[int] = []
    assert ParallelTritonCompile.ahead(torch.device("cpu"), [lambda: ran.append(0)]) is None
    assert ran == [] and "ValueError: NV_PARALLEL_COMPILE='sometimes'" in caplog.text


def _launch_all(x: torch.Tensor, outs: list[torch.Tensor], salt: int) -> None:
    for k, out in enumerate(outs):
        _add_constant[(1,)](x, out, x.numel(), BLOCK=1024, ADD=k + 1, SALT=salt)


@pytest.mark.parametrize("_", [pytest.param(0, marks=gpu)])
def test_launches_inside_compile_only_and_run_compiled_after(_, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))    # an empty cache: every variant compiles here
    salt = random.randrange(1 << 30)                          # and none is in this process's memory
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    outs = [torch.full_like(x, -1.0) for _ in range(3)]
    with ParallelTritonCompile(torch.device("cuda"), max_workers=3) as compile_pass:
        assert compile_pass.active
        _launch_all(x, outs, salt)
        torch.cuda.synchronize()
        assert all(bool((out == -1).all()) for out in outs)   # compiled (or compiling), not run
    assert compile_pass.requested == 3
    with TritonCompileWatch() as watch:
        _launch_all(x, outs, salt)
        torch.cuda.synchronize()
    assert watch.variants == []                               # the pass compiled all three
    for k, out in enumerate(outs):
        torch.testing.assert_close(out, x + k + 1)


@pytest.mark.parametrize("_", [pytest.param(0, marks=gpu)])
def test_switched_off_launches_run(_, monkeypatch):
    monkeypatch.setenv("NV_PARALLEL_COMPILE", "0")
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    outs = [torch.full_like(x, -1.0)]
    with ParallelTritonCompile(torch.device("cuda")) as compile_pass:
        assert not compile_pass.active
        _launch_all(x, outs, random.randrange(1 << 30))
    torch.cuda.synchronize()
    torch.testing.assert_close(outs[0], x + 1)


def ahead_report(salt: int) -> str:
    """Three compile-only passes through ParallelTritonCompile.ahead, each launching its own variant; which passes
    ran and the report (run by the test below in fresh processes)."""
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    out = torch.full_like(x, -1.0)
    calls: list[int] = []

    def launcher(k: int):
        def launch() -> None:
            calls.append(k)
            _add_constant[(1,)](x, out, x.numel(), BLOCK=1024, ADD=k + 1, SALT=salt)
        return launch

    passes = [launcher(k) for k in range(3)]
    first = ParallelTritonCompile.ahead(torch.device("cuda"), passes)
    again = ParallelTritonCompile.ahead(torch.device("cuda"), passes)     # the same process: all in memory
    torch.cuda.synchronize()
    assert first is not None and again is not None and bool((out == -1).all())
    return (f"{calls} {first.compiled} {first.new_variants} {first.probe_only} "
            f"{again.compiled} {again.new_variants} {again.probe_only}")


@pytest.mark.parametrize("_", [pytest.param(0, marks=gpu)])
def test_ahead_probes_with_one_pass_and_skips_the_rest_on_a_warm_cache(_, tmp_path):
    salt = random.randrange(1 << 30)
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
              f"import test_parallel_compile as t; print(t.ahead_report({salt}))")

    def fresh_process() -> str:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300,
                              env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path)}).stdout.splitlines()[-1]

    # an empty cache: the first pass compiles something new, so the other two run (all three compiled ahead);
    # the second call in that process finds every kernel in memory (no probe, nothing skipped)
    assert fresh_process() == "[0, 1, 2, 0, 1, 2] 3 3 False 0 0 False"
    # a new process over the warm cache: the first pass is the probe, finds its kernel on disk, the rest is skipped;
    # the second call skips the pass already in memory and probes with the next one
    assert fresh_process() == "[0, 0, 1] 1 0 True 1 0 True"


@pytest.mark.parametrize("_", [pytest.param(0, marks=gpu)])
def test_a_pass_that_raises_is_logged_and_launches_run_again(_, caplog):
    def garbage_index() -> None:
        raise IndexError("a computed index")

    assert ParallelTritonCompile.ahead(torch.device("cuda"), [garbage_index]) is None
    assert "compiling Triton kernels ahead failed (IndexError: a computed index)" in caplog.text
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    outs = [torch.full_like(x, -1.0)]
    _launch_all(x, outs, random.randrange(1 << 30))            # the launch path is Triton's own again
    torch.cuda.synchronize()
    torch.testing.assert_close(outs[0], x + 1)
