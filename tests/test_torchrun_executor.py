"""TorchrunExecutor under `torchrun --nproc-per-node 2` (CPU, gloo, env:// rendezvous)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    from nv_engine.executor import Executor, TorchrunExecutor
    from nv_engine.executor.testing import FakeConfig

    ex = Executor.create(FakeConfig(tensor_parallel_size=2), "nv_engine.executor.testing:FakeRunner")
    assert isinstance(ex, TorchrunExecutor), type(ex)
    total = ex.call("rank_sum")           # every rank calls in lockstep; the all_reduce pairs up
    echoed = ex.call("echo", ex.rank)
    calls = ex.call("calls_sum")
    print(f"rank {ex.rank}: sum={total} echo={echoed} calls={calls}", flush=True)
    if ex.is_driver:
        print("DRIVER-OUTPUT", flush=True)
    ex.shutdown()
""")


def test_torchrun_two_ranks_in_lockstep(tmp_path):
    script = tmp_path / "tp_script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)],
        capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0: sum=3.0 echo=0 calls=2.0" in out, out
    assert "rank 1: sum=3.0 echo=1 calls=2.0" in out, out
    assert out.count("DRIVER-OUTPUT") == 1, out
