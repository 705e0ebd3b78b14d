"""`nv serve` takes the checkpoint's generation_config.json sampling defaults for the fields a request
leaves unset (vLLM's `--generation-config auto`; the file's max_new_tokens caps every request), and not
under `--generation-config vllm`: a tiny Qwen3 whose generation config says top_k=1 (and temperature 1.5)
answers an otherwise-sampled request greedily. One server for the module."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from nv_engine.entrypoints.server.app import build_state  # noqa: E402
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.protocol import CompletionRequest  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402
from nv_engine.sampling_params import SamplingParams  # noqa: E402

PROMPT = "The quick brown fox"
SEEDS = range(4)
ENGINE_ARGS = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4,
                   num_gpu_blocks_override=64, block_size=16)


@pytest.fixture(scope="module")
def model_dir(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generation_config") / "model"
    shutil.copytree(tiny_qwen3_dir, out)
    (out / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "top_k": 1, "temperature": 1.5, "max_new_tokens": 3}))
    return out


@pytest.fixture(scope="module")
def http(model_dir: Path):
    engine = create_engine(str(model_dir), **ENGINE_ARGS)
    args = argparse.Namespace(model=str(model_dir), served_model_name=["tiny"], api_key=None, max_n=4,
                           chat_template=None)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client
    engine.shutdown()


def complete(http, **fields) -> str:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True, **fields}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_unset_fields_take_the_generation_config(http):
    greedy = complete(http, temperature=0)
    assert {complete(http, seed=seed) for seed in SEEDS} == {greedy}        # top_k=1: greedy
    assert {complete(http, seed=seed, top_k=None) for seed in SEEDS} == {greedy}   # null is unset


def test_max_new_tokens_caps_every_request(http):
    body = {"model": "tiny", "prompt": PROMPT, "ignore_eos": True}
    unset = http.post("/v1/completions", json=body)
    assert unset.status_code == 200, unset.text
    assert unset.json()["usage"]["completion_tokens"] == 3              # the file's max_new_tokens
    chat = http.post("/v1/chat/completions", json={"model": "tiny", "ignore_eos": True,
                                                   "messages": [{"role": "user", "content": PROMPT}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == 3
    capped = http.post("/v1/completions", json={**body, "max_tokens": 8})   # a server-wide limit, as vLLM's
    assert capped.json()["usage"]["completion_tokens"] == 3


def test_fields_the_request_sets_win(http):
    greedy = complete(http, temperature=0)
    assert any(complete(http, seed=seed, top_k=-1) != greedy for seed in SEEDS)
    assert any(complete(http, seed=seed, top_k=50, temperature=1.0) != greedy for seed in SEEDS)


def test_generation_config_vllm_applies_no_defaults(model_dir: Path):
    from nv_engine.config.engine_args import EngineArgs

    auto = EngineArgs.from_kwargs(str(model_dir), **ENGINE_ARGS).create_engine_config()
    assert auto.default_sampling_params() == {"temperature": 1.5, "top_k": 1, "max_tokens": 3}
    config = EngineArgs.from_kwargs(str(model_dir), generation_config="vllm",
                                    **ENGINE_ARGS).create_engine_config()
    assert config.default_sampling_params() == {}
    state = build_state(object(), tokenizer=None, sampling_params_cls=SamplingParams, model_path=str(model_dir),
                        max_model_len=128, default_sampling=config.default_sampling_params())
    params = state.build_sampling_params(CompletionRequest(prompt=PROMPT), max_tokens=8, logprobs=None)
    assert (params.temperature, params.top_k) == (1.0, 0)
