"""The nv CLI end to end (`nv generate`, a tiny `nv bench`) and the benchmark's workload and floor."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nv_engine.entrypoints import cli
from nv_engine.entrypoints.bench.throughput import floor_bytes, make_workload


def test_workload_is_benchmark_md_exactly():
    work = make_workload()
    assert len(work.prompts) == 256
    assert (work.prompt_tokens, work.output_tokens) == (142_827, 133_966)    # BENCHMARK.md's counts


def test_floor_matches_benchmark_md():
    # Qwen3-0.6B: 596M parameters in bf16; 114,688 bytes of KV per token (PERF-NOTES.md)
    floor = floor_bytes(make_workload(), 596_049_920 * 2, 114_688, max_num_seqs=256)
    assert floor["decode_steps"] == 1024
    assert floor["weight_bytes"] / 1e12 == pytest.approx(1.22, abs=0.01)
    assert floor["kv_bytes"] / 1e12 == pytest.approx(13.85, rel=0.01)
    assert floor["total_bytes"] / 1e12 == pytest.approx(15.07, rel=0.01)


def test_nv_generate_random_weights_builds_a_random_qwen3(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.main(["generate", "Hello, my name is", "The capital of France is", "--max-tokens", "6",
                     "--random-weights"]) == 0
    captured = capsys.readouterr()
    assert "built a small random-weight Qwen3" in captured.err and str(tmp_path / "nv") in captured.err
    assert captured.out.count("Completion: ") == 2 and "Prompt: 'Hello, my name is'" in captured.out
    assert cli.main(["generate", "again", "--max-tokens", "2", "--chat", "--random-weights"]) == 0
    assert "using the small random-weight Qwen3" in capsys.readouterr().err


def test_nv_generate_as_a_module(tiny_model_dir):
    result = subprocess.run(
        [sys.executable, "-m", "nv_engine.entrypoints.cli", "generate", "--model", str(tiny_model_dir),
         "--max-tokens", "4", "Hi there"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "Completion: " in result.stdout


def test_nv_generate_reports_bad_input(tiny_model_dir, capsys):
    assert cli.main(["generate", "--model", str(tiny_model_dir), "--max-tokens", "0", "x"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_tiny_nv_bench_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", "--random-weights", "--shape", "tiny", "--num-prompts", "6", "--min-input-len", "8",
                     "--max-input-len", "40", "--min-output-len", "4", "--max-output-len", "24",
                     "--max-model-len", "128", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "Throughput: " in printed and " requests/s, " in printed and " output tokens/s" in printed
    assert "of the floor" in printed and "Wall time: " in printed
    result = json.loads(out_json.read_text())
    expected = make_workload(6, (8, 40), (4, 24), max_token_id=511)
    assert result["output_tokens"] == expected.output_tokens and result["prompt_tokens"] == expected.prompt_tokens
    assert result["floor_ratio"] > 0
    assert result["timed_triton_compiles"] == [] and "Triton compiles inside the timed run: 0" in printed


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "generate" in text and "bench" in text
