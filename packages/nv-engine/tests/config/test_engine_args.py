"""EngineArgs: one list of engine arguments behind `LLM(...)` keywords and the flags of `nv generate`,
`nv bench` and `nv serve`; vLLM's keywords accepted with their meaning or refused with a reason."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil

import pytest

from nv_engine.__about__ import __version__
from nv_engine.config.engine_args import EngineArgs
from nv_engine.entrypoints import cli
from nv_engine.entrypoints.llm import LLM
from nv_engine.sampling_params import SamplingParams

ENGINE_FIELDS = [f for f in dataclasses.fields(EngineArgs) if f.name != "model"]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    root = cli.build_parser()
    return {"generate": _subparser(root, "generate"),
            "bench throughput": _subparser(_subparser(root, "bench"), "throughput"),
            "serve": _subparser(root, "serve")}


@pytest.mark.parametrize("command", ["generate", "bench throughput", "serve"])
def test_every_engine_argument_is_a_flag_with_one_spelling(command):
    parser = command_parsers()[command]
    spellings = {a.dest: a.option_strings for a in parser._actions}
    assert "model" in spellings
    for f in ENGINE_FIELDS:
        flag = "--" + f.name.replace("_", "-")
        expected = [flag, *f.metadata["aliases"]]
        if f.metadata["type"] is bool:
            expected.append("--no-" + flag[2:])
        assert spellings.get(f.name) == expected, (command, f.name)
    assert spellings["tensor_parallel_size"] == ["--tensor-parallel-size", "-tp"]


def test_cli_defaults_are_the_engine_defaults_except_where_a_command_overrides():
    parsers = command_parsers()
    defaults = {name: p.parse_args(["--model", "m", "x"] if name == "generate" else
                                   (["m"] if name == "serve" else [])) for name, p in parsers.items()}
    for f in ENGINE_FIELDS:
        if f.name == "max_model_len":
            continue
        for name, args in defaults.items():
            assert getattr(args, f.name) == f.default, (name, f.name)
    assert defaults["bench throughput"].max_model_len == 4096    # the workload's context
    assert defaults["generate"].max_model_len is None and defaults["serve"].max_model_len is None
    engine = EngineArgs.from_cli_args(defaults["serve"])
    assert engine == EngineArgs(model="m")


def test_seed_is_the_engine_seed_and_sampling_seed_the_sampling_one():
    args = cli.parse_args(["generate", "hi", "--seed", "5", "--sampling-seed", "3", "-tp", "1",
                           "--no-enable-prefix-caching"])
    assert (args.seed, args.sampling_seed, args.enable_prefix_caching) == (5, 3, False)


def test_nv_bench_is_short_for_nv_bench_throughput():
    short = cli.parse_args(["bench", "--random-weights", "--shape", "tiny", "--num-prompts", "4"])
    full = cli.parse_args(["bench", "throughput", "--random-weights", "--shape", "tiny", "--num-prompts", "4"])
    assert vars(short) == vars(full) and full.func is cli.run_bench_command
    assert cli.parse_args(["bench"]).num_prompts == 256
    assert cli.parse_args(["--log-level", "INFO", "bench", "--no-warmup"]).no_warmup is True
    assert cli.parse_args(["generate", "bench"]).prompts == ["bench"]     # a prompt, not a command


def test_nv_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"nv {__version__}"


def test_llm_rejects_an_unknown_keyword_listing_the_accepted_ones(tiny_model_dir):
    with pytest.raises(TypeError, match="not_an_engine_argument") as info:
        LLM(str(tiny_model_dir), not_an_engine_argument=1)
    for f in ENGINE_FIELDS:
        assert repr(f.name) in str(info.value)


# vLLM keyword -> a value nv accepts with vLLM's meaning
ACCEPTED = [("trust_remote_code", False), ("revision", "main"), ("download_dir", "/tmp/x"),
            ("hf_token", "hf_x"), ("tokenizer_revision", "main"), ("quantization", None), ("quantization", "fp8"),
            ("quantization", "awq"), ("quantization", "gptq"),
            ("kv_cache_dtype", "auto"), ("kv_cache_dtype", "fp8"), ("kv_cache_dtype", "fp8_e5m2"),
            ("calculate_kv_scales", True), ("enable_chunked_prefill", True), ("swap_space", 0),
            ("cpu_offload_gb", 0), ("speculative_config", None), ("enable_lora", False),
            ("speculative_config", {"method": "ngram"}), ("speculative_config", {"model": "/draft"}),
            ("max_lora_rank", 8), ("generation_config", "vllm"), ("max_logprobs", 5),
            ("pipeline_parallel_size", 1), ("distributed_executor_backend", "mp"),
            ("distributed_executor_backend", None), ("disable_log_stats", True),
            ("max_seq_len_to_capture", 4096), ("enforce_eager", True), ("seed", 7),
            ("tokenizer_mode", "auto"), ("disable_custom_all_reduce", True)]
# vLLM keyword -> a value nv refuses (ValueError naming the keyword)
REFUSED = [("trust_remote_code", True), ("quantization", "bitsandbytes"), ("quantization", "gptq"),
           ("kv_cache_dtype", "fp8_e4m3fn"),
           ("kv_cache_dtype", "int3"), ("cpu_offload_gb", 4),
           ("speculative_config", {"method": "eagle"}), ("enable_lora", True),
           ("generation_config", "/no/such/folder"), ("max_logprobs", 10_000),
           ("pipeline_parallel_size", 2), ("distributed_executor_backend", "ray"),
           ("tokenizer_mode", "slow")]


@pytest.mark.parametrize("name,value", ACCEPTED)
def test_vllm_keyword_accepted(name, value):
    args = EngineArgs(model="m", **{name: value})
    assert getattr(args, name) == value


@pytest.mark.parametrize("name,value", REFUSED)
def test_vllm_keyword_refused_with_its_name(tiny_model_dir, name, value):
    with pytest.raises(ValueError, match=name):
        LLM(str(tiny_model_dir), **{name: value})


def test_refusals_say_what_to_use_instead():
    with pytest.raises(ValueError, match="never runs code from a checkpoint"):
        EngineArgs(model="m", trust_remote_code=True)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3, fp8_e5m2"):
        EngineArgs(model="m", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="use 'mp'"):
        EngineArgs(model="m", distributed_executor_backend="ray")


def test_swap_space_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="nv_engine.config.engine_args"):
        EngineArgs(model="m", swap_space=16)
    assert "swap_space=16 is ignored" in caplog.text


def test_no_chunked_prefill_means_a_step_budget_of_a_whole_prompt(tiny_model_dir):
    config = EngineArgs(str(tiny_model_dir), enable_chunked_prefill=False, max_model_len=1024,
                        max_num_batched_tokens=None).create_engine_config()
    assert config.max_num_batched_tokens >= config.max_model_len == 1024
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        EngineArgs(str(tiny_model_dir), enable_chunked_prefill=False, max_model_len=1024,
                   max_num_batched_tokens=256).create_engine_config()


def test_hub_options_reach_the_hub_download(tiny_model_dir, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(**kwargs):
        calls.append(kwargs)
        return str(tiny_model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    config = EngineArgs("some-org/some-model", revision="v1", download_dir="/tmp/hub", hf_token="hf_abc",
                        tokenizer="some-org/some-tokenizer", tokenizer_revision="v2").create_engine_config()
    assert config.model == config.tokenizer == str(tiny_model_dir)
    model_call, tokenizer_call = calls
    assert model_call["repo_id"] == "some-org/some-model" and model_call["revision"] == "v1"
    assert tokenizer_call["repo_id"] == "some-org/some-tokenizer" and tokenizer_call["revision"] == "v2"
    for call in calls:
        assert (call["cache_dir"], call["token"]) == ("/tmp/hub", "hf_abc")


GENERATION_CONFIG = {"eos_token_id": 0, "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                     "repetition_penalty": 1.05, "max_new_tokens": 5}


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_model_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("generation_config") / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return model_dir


def test_default_sampling_params_come_from_generation_config(model_with_generation_config):
    with LLM(str(model_with_generation_config), max_logprobs=2) as llm:
        defaults = llm.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.7, 0.8, 20)
        assert (defaults.repetition_penalty, defaults.max_tokens) == (1.05, 5)
        out = llm.generate("hello there", use_tqdm=False)[0]       # no SamplingParams: the defaults
        assert 1 <= len(out.outputs[0].token_ids) <= 5
        with pytest.raises(ValueError, match="max_logprobs"):
            llm.generate("hello", SamplingParams(logprobs=3, max_tokens=2), use_tqdm=False)
        ok = llm.generate("hello", SamplingParams(logprobs=2, max_tokens=2, temperature=0), use_tqdm=False)
        assert len(ok[0].outputs[0].logprobs) == 2            # the engine still serves the next request


def test_generation_config_vllm_or_a_folder(model_with_generation_config, tiny_model_dir, tmp_path):
    vllm = EngineArgs(str(model_with_generation_config), generation_config="vllm").create_engine_config()
    assert vllm.default_sampling_params() == {}
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "min_p": 0.1}))
    other = EngineArgs(str(tiny_model_dir), generation_config=str(folder)).create_engine_config()
    assert other.default_sampling_params() == {"temperature": 0.3, "min_p": 0.1}
    plain = EngineArgs(str(tiny_model_dir)).create_engine_config()
    assert plain.default_sampling_params() == {}          # do_sample / eos only: nothing to apply


def test_cuda_graph_mode_resolution(tiny_model_dir):
    """Default full_and_piecewise; enforce_eager means none; vLLM's capital spelling is accepted; contradictions
    and unknown modes are refused before the model is read."""
    def mode(**kwargs) -> str:
        return EngineArgs(str(tiny_model_dir), device="cpu", **kwargs).create_engine_config().cuda_graph_mode

    assert mode() == "full_and_piecewise"
    assert mode(enforce_eager=True) == "none"
    assert mode(cuda_graph_mode="FULL_DECODE_ONLY") == "full_decode_only"
    config = EngineArgs(str(tiny_model_dir), device="cpu", cuda_graph_mode="none").create_engine_config()
    assert config.enforce_eager and not config.piecewise_graphs
    with pytest.raises(ValueError, match="contradict"):
        EngineArgs("unused", enforce_eager=True, cuda_graph_mode="full_decode_only")
    with pytest.raises(ValueError, match="cuda_graph_mode"):
        EngineArgs("unused", cuda_graph_mode="piecewise_sometimes")


def test_former_environment_switches_are_engine_arguments(tiny_model_dir):
    """CUDA-graph mode, fused ops, the grammar matcher process, the CPU KV budget and the collective timeout
    are engine arguments: flags of every command, keywords of LLM, fields of EngineConfig."""
    parser = EngineArgs.add_cli_arguments(argparse.ArgumentParser())
    parser.add_argument("model")
    args = parser.parse_args([str(tiny_model_dir), "--cuda-graph-mode", "full_decode_only", "--fused-ops", "off",
                              "--grammar-matcher-process", "--cpu-kv-cache-space-gib", "0.25",
                              "--distributed-timeout-s", "30", "--device", "cpu"])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert (config.cuda_graph_mode, config.fused_ops, config.grammar_matcher_process,
            config.cpu_kv_cache_space_gib, config.distributed_timeout_s) == ("full_decode_only", "off", True, 0.25,
                                                                             30.0)
    default = EngineArgs(str(tiny_model_dir), device="cpu").create_engine_config()
    assert (default.fused_ops, default.grammar_matcher_process, default.cpu_kv_cache_space_gib,
            default.distributed_timeout_s) == ("auto", None, 4.0, 600.0)
    for name, bad in [("fused_ops", "sometimes"), ("cpu_kv_cache_space_gib", -1.0), ("distributed_timeout_s", 0)]:
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(default, **{name: bad}).validate()
    with pytest.raises(SystemExit):
        parser.parse_args([str(tiny_model_dir), "--fused-ops", "sometimes"])
