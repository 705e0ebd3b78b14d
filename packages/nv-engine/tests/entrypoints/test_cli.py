"""The nv CLI end to end (`nv generate`, a tiny `nv bench`), the benchmark's workload, floor and flag checks, and
`nv serve`'s optional MODEL."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from nv_engine.entrypoints import cli
from nv_engine.entrypoints.bench.throughput import (
    SMALL_WARMUP_OUTPUT_TOKENS,
    checkpoint_weight_bytes,
    floor_bytes,
    kv_bytes_per_token,
    make_workload,
)
from nv_engine.entrypoints.llm import LLM


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


def test_fp8_kv_floor_reads_half_the_kv_bytes():
    # Qwen3-0.6B's attention shape: 28 layers x 8 KV heads x head_dim 128
    hf = SimpleNamespace(num_hidden_layers=28, num_key_value_heads=8, head_dim=128, hidden_size=1024,
                         num_attention_heads=16)
    bf16 = kv_bytes_per_token(hf, torch.bfloat16)
    fp8 = kv_bytes_per_token(hf, torch.float8_e4m3fn)
    assert (bf16, fp8) == (114_688, 57_344)
    work = make_workload()
    auto_floor = floor_bytes(work, 596_049_920 * 2, bf16, max_num_seqs=256)
    fp8_floor = floor_bytes(work, 596_049_920 * 2, fp8, max_num_seqs=256)
    assert fp8_floor["kv_bytes"] * 2 == auto_floor["kv_bytes"]
    assert fp8_floor["weight_bytes"] == auto_floor["weight_bytes"]
    assert fp8_floor["total_bytes"] / 1e12 == pytest.approx(1.22 + 13.85 / 2, rel=0.01)


def test_tiny_nv_bench_with_an_fp8_cache_and_fp8_weights_prints_their_floor(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", "--random-weights", "--shape", "tiny", "--num-prompts", "2", "--min-input-len", "8",
                     "--max-input-len", "16", "--min-output-len", "4", "--max-output-len", "8", "--no-warmup",
                     "--max-model-len", "64", "--device", "cpu", "--kv-cache-dtype", "fp8", "--quantization", "fp8",
                     "--json", str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    # the tiny shape: 4 layers x 2 KV heads x head_dim 32, K and V, 1 byte each
    assert result["kv_cache_dtype"] == "torch.float8_e4m3fn" and result["kv_bytes_per_token"] == 4 * 2 * 32 * 2
    work = make_workload(2, (8, 16), (4, 8), max_token_id=511)
    reads = sum(out * len(p) + out * (out + 1) // 2 for p, out in zip(work.prompts, work.max_tokens, strict=True))
    assert result["kv_bytes"] == reads * 4 * 2 * 32 * 2
    # the weights a step reads: the projections' FP8 codes and block scales, the rest at the model's dtype
    model = str(tmp_path / "nv" / "bench-random-tiny-bf16")
    itemsize = torch.empty(0, dtype=getattr(torch, result["dtype"].removeprefix("torch."))).element_size()
    per_step = checkpoint_weight_bytes(model, itemsize, "fp8")
    assert result["quantization"] == "fp8" and result["weight_bytes"] == per_step * result["decode_steps"]
    assert per_step < checkpoint_weight_bytes(model, itemsize)
    out = capsys.readouterr().out
    assert "tokens of 512 bytes (torch.float8_e4m3fn)" in out and "fp8 weights" in out


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
    """On a CPU: a warm-up of two short requests (not the GPU's sweep of batch shapes, minutes on a CPU), said
    on stdout; the timed run's progress on stderr; the result lines and the JSON file as before."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []     # (prompts, max_tokens of each, progress shown) of every LLM.generate
    generate = LLM.generate

    def recording_generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        limits = [p.max_tokens for p in sampling_params] if isinstance(sampling_params, list) else \
            [sampling_params.max_tokens] * len(prompts)
        calls.append((len(prompts), limits, use_tqdm))
        return generate(self, prompts, sampling_params, use_tqdm=use_tqdm)

    monkeypatch.setattr(LLM, "generate", recording_generate)
    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", "--random-weights", "--shape", "tiny", "--num-prompts", "6", "--min-input-len", "8",
                     "--max-input-len", "40", "--min-output-len", "4", "--max-output-len", "24",
                     "--max-model-len", "128", "--device", "cpu", "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    *warmup, timed = calls
    assert [(n, set(limits), progress) for n, limits, progress in warmup] == [(2, {SMALL_WARMUP_OUTPUT_TOKENS}, False)]
    assert timed[0] == 6 and timed[2] is True
    assert "Warm-up on cpu: 2 short requests" in printed
    assert "Processed prompts" in captured.err and "6/6" in captured.err       # progress, on stderr only
    assert "Processed prompts" not in printed
    assert "Throughput: " in printed and " requests/s, " in printed and " output tokens/s" in printed
    assert "of the floor" in printed and "Wall time: " in printed
    result = json.loads(out_json.read_text())
    assert result["warmup"] == "small"
    expected = make_workload(6, (8, 40), (4, 24), max_token_id=511)
    assert result["output_tokens"] == expected.output_tokens and result["prompt_tokens"] == expected.prompt_tokens
    assert result["floor_ratio"] > 0
    assert result["timed_triton_compiles"] == [] and "Triton compiles inside the timed run: 0" in printed


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "generate" in text and "bench" in text


@pytest.mark.parametrize(("flags", "named"), [
    (["--max-input-len", "5"], "--max-input-len (5) must be at least --min-input-len (100)"),
    (["--min-output-len", "50", "--max-output-len", "20"], "--max-output-len (20) must be at least --min-output-len"),
    (["--min-input-len", "0"], "--min-input-len must be at least 1"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--max-output-len", "4000"], "do not fit --max-model-len 4096"),
    (["--shape", "qwen3-7b"], "--shape 'qwen3-7b' is not a known shape"),
])
def test_nv_bench_rejects_bad_workload_flags_before_any_work(flags, named, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(LLM, "__init__", lambda *a, **k: pytest.fail("the engine started"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--random-weights", "--shape", "tiny", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "nv bench throughput: error: " in err and named in err
    assert list(tmp_path.iterdir()) == []          # no random checkpoint written


def test_nv_serve_model_is_optional_and_its_help_says_what_it_may_be(capsys):
    pytest.importorskip("fastapi")
    assert cli.parse_args(["serve"]).model is None
    assert cli.parse_args(["serve", "some/dir", "--port", "8001"]).model == "some/dir"
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("HF checkpoint directory", "hub id", ".gguf file", "default: SmolLM2-135M-Instruct"):
        assert words in text


def test_nv_serve_without_the_default_model_says_so_before_the_engine_starts(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from nv_engine.entrypoints.server import cli as server_cli
    from nv_engine.model_loader.gguf.default_model import DEFAULT_GGUF_ENV

    monkeypatch.setenv(DEFAULT_GGUF_ENV, str(tmp_path / "missing.gguf"))
    monkeypatch.setattr(server_cli, "create_async_llm", lambda *a, **k: pytest.fail("the engine started"))
    with pytest.raises(SystemExit, match=r"nv serve: .*missing\.gguf' is not a file"):
        server_cli.run_server(cli.parse_args(["serve"]))
