"""The demo runs, is exact, and the decode hot path stays cheap."""
import subprocess
import sys

from nv_kvcache.demo import bench_decode, main


def test_demo_workload_preempts_hits_and_is_exact(capsys):
    assert main([]) == 0
    text = capsys.readouterr().out
    assert "outputs identical to undisturbed runs: yes; blocks still in use: 0" in text
    preemptions = int(text.split("preemptions ")[1].split()[0])
    hit_rate = float(text.split("hit rate ")[1].split("%")[0])
    assert preemptions > 0 and hit_rate > 20


def test_demo_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "nv_kvcache.demo", "--num-requests", "8", "--print-every", "1000"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "prefix-cache hit rate" in proc.stdout


def test_decode_step_cost_is_small():
    # Target: well under 0.5 ms per step at batch 256 (about 0.07 ms measured). The bound here is
    # loose so a busy CI machine does not flake; an O(n^2) step or per-token Python work breaks it.
    result = min((bench_decode(batch=256, steps=60) for _ in range(2)), key=lambda r: r["total_us"])
    assert result["total_us"] < 1500, result
