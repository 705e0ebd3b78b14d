"""TorchrunExecutor under `torchrun --nproc-per-node 2` (CPU, gloo, env:// rendezvous)."""
from __future__ import annotations

import textwrap

from nv_engine.executor.testing import run_torchrun

SCRIPT = textwrap.dedent("""
    from nv_engine.executor import TorchrunExecutor, create_executor
    from nv_engine.executor.testing import FakeConfig

    ex = create_executor(FakeConfig(tensor_parallel_size=2), "nv_engine.executor.testing:FakeRunner")
    assert isinstance(ex, TorchrunExecutor), type(ex)
    total = ex.run_on_all_ranks("rank_sum")           # every rank calls in lockstep; the all_reduce pairs up
    echoed = ex.run_on_all_ranks("echo", f"from rank {ex.rank}")   # every rank gets rank 0's result
    try:
        ex.run_on_all_ranks("raise_on", 1, before_collective=False)
        failure = "none"
    except Exception as exc:              # every rank learns that rank 1 failed
        failure = type(exc).__name__ + ("+tb" if "Traceback" in str(exc) else "")
    calls = ex.run_on_all_ranks("calls_sum")          # still in lockstep after the failure
    print(f"rank {ex.rank}: sum={total} echo={echoed!r} failure={failure} calls={calls}", flush=True)
    if ex.is_driver:
        print("DRIVER-OUTPUT", flush=True)
    ex.shutdown()
""")


def test_torchrun_two_ranks_in_lockstep(tmp_path):
    script = tmp_path / "tp_script.py"
    script.write_text(SCRIPT)
    proc = run_torchrun(script)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0: sum=3.0 echo='from rank 0' failure=RuntimeError+tb calls=2.0" in out, out
    assert "rank 1: sum=3.0 echo='from rank 0' failure=ValueError calls=2.0" in out, out
    assert out.count("DRIVER-OUTPUT") == 1, out
