"""`nv bench serve` against a real `nv serve` on a tiny random Qwen3 (one server for the module), the
server's `stream_options.continuous_usage_stats`, and the benchmark's aggregation on known timings."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from nv_engine.entrypoints import cli  # noqa: E402
from nv_engine.entrypoints.bench.serve import arrival_times  # noqa: E402
from nv_engine.entrypoints.bench.serve_dataset import BenchServeDataset  # noqa: E402
from nv_engine.entrypoints.bench.serve_metrics import BenchServeMetrics  # noqa: E402
from nv_engine.entrypoints.bench.serve_types import RequestRecord  # noqa: E402
from nv_engine.entrypoints.bench.throughput import make_workload  # noqa: E402
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

API_KEY = "bench-key"
MODEL = "tiny"
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path):
    engine = create_engine(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_model_len=256,
                           max_num_seqs=16, num_gpu_blocks_override=256, block_size=16)
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=[MODEL], api_key=API_KEY, max_n=4)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url:
        yield SimpleNamespace(url=url, engine=engine)
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


# ---- stream_options.continuous_usage_stats ---------------------------------------------------------

def test_completion_chunks_carry_usage_so_far(client):
    chunks = list(client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=6, n=2, stream=True,
                                            stream_options=CONTINUOUS, extra_body={"ignore_eos": True}))
    *token_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 12     # the final usage: both choices
    seen = {0: 0, 1: 0}
    for chunk in token_chunks:
        (choice,) = chunk.choices
        assert chunk.usage is not None and chunk.usage.prompt_tokens == 4
        assert chunk.usage.completion_tokens > seen[choice.index]        # this choice's tokens so far
        assert chunk.usage.total_tokens == 4 + chunk.usage.completion_tokens
        seen[choice.index] = chunk.usage.completion_tokens
    assert seen == {0: 6, 1: 6}


def test_chat_chunks_carry_usage_so_far(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=5, stream=True,
        stream_options=CONTINUOUS, extra_body={"ignore_eos": True}))
    with_choice = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in with_choice)
    assert with_choice[0].usage.completion_tokens == 0                   # the role chunk
    assert with_choice[-1].choices[0].finish_reason == "length" and with_choice[-1].usage.completion_tokens == 5
    counts = [c.usage.completion_tokens for c in with_choice]
    assert counts == sorted(counts)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_usage_only_at_the_end_without_continuous_usage_stats(client):
    chunks = list(client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.completion_tokens == 3
    plain = list(client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3, stream=True,
                                           stream_options={"continuous_usage_stats": True},
                                           extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in plain)    # continuous_usage_stats needs include_usage (as vLLM)


# ---- nv bench serve end to end ------------------------------------------------------------------------

def test_bench_serve_completions_per_token(server, tmp_path, capsys):
    result_file = tmp_path / "result.json"
    flags = ["--dataset-name", "random", "--num-prompts", "8", "--random-input-len", "12", "--random-output-len",
             "6", "--random-range-ratio", "0.5", "--max-token-id", "300", "--seed", "3"]
    assert cli.main(["bench", "serve", "--base-url", server.url, "--api-key", API_KEY, *flags,
                     "--max-concurrency", "4", "--num-workers", "2", "--ignore-eos",
                     "--result-file", str(result_file)]) == 0
    table = capsys.readouterr().out
    assert "Serving Benchmark Result" in table and "Successful requests:" in table and "per chunk" not in table
    result = json.loads(result_file.read_text())
    expected = BenchServeDataset.random(8, 3, 300, 12, 6, 0.5).requests
    assert (result["completed"], result["failed"], result["model"]) == (8, 0, MODEL)   # model from /v1/models
    assert result["itl_tpot_unit"] == "per token"
    assert result["output_lens"] == [r.output_len for r in expected]                  # ignore_eos: all of them
    assert result["input_lens"] == [r.prompt_len for r in expected]
    assert result["total_output_tokens"] == sum(r.output_len for r in expected)
    for ttft, e2el, itl, n in zip(result["ttfts"], result["e2els"], result["itls"], result["output_lens"],
                                  strict=True):
        assert 0 < ttft <= e2el and len(itl) == n - 1
        assert ttft + sum(itl) == pytest.approx(e2el, abs=1e-6)
    assert result["p50_ttft_ms"] <= result["p99_ttft_ms"] and result["output_throughput"] > 0


def test_bench_serve_chat_from_jsonl(server, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Hello, how are you?", "max_tokens": 4}\n{"prompt": "Tell me a story", '
                    '"output_len": 3}\n\n{"prompt": "Why?"}\n')
    result_file = tmp_path / "chat.json"
    assert cli.main(["bench", "serve", "--base-url", server.url, "--api-key", API_KEY, "--model", MODEL,
                     "--endpoint", "/v1/chat/completions", "--dataset-name", "jsonl", "--dataset-path", str(data),
                     "--output-len", "2", "--num-prompts", "4", "--num-workers", "1", "--request-rate", "50",
                     "--ignore-eos", "--result-file", str(result_file)]) == 0
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"]) == (4, 0)
    assert result["output_lens"] == [4, 3, 2, 4] and all(n > 0 for n in result["input_lens"])


def test_jsonl_extra_body_fields_reach_the_server(server, tmp_path):
    """A line's extra_body is merged over the benchmark's own fields: max_tokens 1 overrides the line's 4, and a
    field the server refuses fails only that request (400)."""
    data = tmp_path / "extra.jsonl"
    data.write_text('{"prompt": "Hello", "max_tokens": 4, "extra_body": {"max_tokens": 1}}\n'
                    '{"prompt": "Hello", "max_tokens": 4, "extra_body": {"ignore_eos": true}}\n'
                    '{"prompt": "Hello", "max_tokens": 4, "extra_body": {"logit_bias": {"x": 1}}}\n')
    result_file = tmp_path / "extra.json"
    assert cli.main(["bench", "serve", "--base-url", server.url, "--api-key", API_KEY, "--model", MODEL,
                     "--endpoint", "/v1/chat/completions", "--dataset-name", "jsonl", "--dataset-path", str(data),
                     "--num-prompts", "3", "--num-workers", "1", "--result-file", str(result_file)]) == 0
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"]) == (2, 1)
    errors = result["errors"]
    assert errors[:2] == ["", ""] and "HTTP 400" in errors[2] and "logit_bias" in errors[2]
    assert result["output_lens"] == [1, 4, 0]


def test_jsonl_extra_body_must_be_an_object(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "Hello", "extra_body": [1]}\n')
    with pytest.raises(ValueError, match="line 1: extra_body must be a JSON object"):
        BenchServeDataset.jsonl(str(data), 1, 4)


def test_bench_serve_counts_failures(server, tmp_path):
    result_file = tmp_path / "bad.json"
    assert cli.main(["bench", "serve", "--base-url", server.url, "--api-key", "wrong", "--model", MODEL,
                     "--dataset-name", "random", "--num-prompts", "2", "--random-input-len", "4",
                     "--random-output-len", "2", "--num-workers", "1", "--result-file", str(result_file)]) == 0
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"]) == (0, 2) and "401" in result["errors"][0]


def test_bench_serve_refuses_token_prompts_for_chat(capsys):
    assert cli.main(["bench", "serve", "--endpoint", "/v1/chat/completions", "--num-prompts", "2"]) == 2
    assert "text prompts" in capsys.readouterr().err


def test_bench_serve_says_when_no_server_answers(capsys):
    with socket.socket() as sock:     # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert cli.main(["bench", "serve", "--port", str(port), "--num-prompts", "2"]) == 2
    assert "cannot reach" in capsys.readouterr().err


# ---- the pieces -----------------------------------------------------------------------------------------

def test_headline_dataset_is_the_throughput_benchmarks():
    work = make_workload()
    requests = BenchServeDataset.headline(256, 0, 10000).requests
    assert [r.prompt for r in requests] == work.prompts
    assert [r.output_len for r in requests] == work.max_tokens


def test_poisson_arrivals():
    assert arrival_times(3, float("inf"), 0) == [0.0, 0.0, 0.0]
    times = arrival_times(4000, 20.0, 1)
    assert times[0] == 0.0 and times == sorted(times)
    assert np.mean(np.diff(times)) == pytest.approx(1 / 20.0, rel=0.05)


def _record(index: int, ttft: float, itl: list[float], per_token: bool = True, success: bool = True):
    return RequestRecord(index, success=success, prompt_len=10, output_tokens=len(itl) + 1,
                         num_chunks=len(itl) + 1, ttft=ttft, e2el=ttft + sum(itl), itl=itl, per_token=per_token)


def test_metrics_on_known_timings():
    records = [_record(0, 0.1, [0.01, 0.03]), _record(1, 0.3, [0.02]), _record(2, 0.2, []),
               RequestRecord(3, error="HTTP 500")]
    m = BenchServeMetrics(records, duration_s=2.0, selected=["ttft", "tpot", "itl", "e2el"],
                          percentiles=[50, 90])
    d = m.to_dict()
    assert (d["completed"], d["failed"]) == (3, 1)
    assert (d["total_input_tokens"], d["total_output_tokens"]) == (30, 6)
    assert d["request_throughput"] == pytest.approx(1.5) and d["total_token_throughput"] == pytest.approx(18.0)
    assert d["mean_ttft_ms"] == pytest.approx(200.0) and d["median_ttft_ms"] == pytest.approx(200.0)
    assert d["p90_ttft_ms"] == pytest.approx(280.0)                  # 200 + 0.8 * (300 - 200)
    # ITLs 10, 30, 20 ms: mean 20, p90 between 20 and 30 at 0.8
    assert d["mean_itl_ms"] == pytest.approx(20.0) and d["p90_itl_ms"] == pytest.approx(28.0)
    # TPOT per request with 2+ tokens: (40 / 2, 20 / 1) ms; the one-token request has none
    assert d["mean_tpot_ms"] == pytest.approx(20.0) and d["std_tpot_ms"] == pytest.approx(0.0)
    assert d["median_e2el_ms"] == pytest.approx(200.0) and d["p50_e2el_ms"] == pytest.approx(200.0)
    assert d["itl_tpot_unit"] == "per token" and "P90 ITL (ms):" in m.table()


def test_metrics_say_per_chunk_without_chunk_usage():
    m = BenchServeMetrics([_record(0, 0.1, [0.01], per_token=False), _record(1, 0.1, [0.02])], 1.0)
    assert m.to_dict()["itl_tpot_unit"] == "per chunk"
    assert "Inter-token Latency (per chunk)" in m.table()
    with pytest.raises(ValueError, match="unknown percentile metric"):
        BenchServeMetrics([], 1.0, selected=["ttfb"])
