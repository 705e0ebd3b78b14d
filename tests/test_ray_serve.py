"""nv on Ray Serve: a local Ray cluster (loopback only, no dashboard, no usage statistics) serves two
replicas of the tiny random Qwen3 through Ray's HTTP proxy; the openai client gets the offline LLM's
greedy text from each replica, plain and streamed; a replica whose engine core dies is replaced (Ray's
health check). And `build_app`'s args: `nv serve`'s flags with their checks, the deployment's options with
their defaults, the README's `serve run` config."""
from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"   # before Ray starts; its processes inherit it
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from nv_engine.entrypoints.ray_serve import DEPLOYMENT_NAME, build_app  # noqa: E402
from nv_engine.entrypoints.ray_serve.app_args import RayAppArgs  # noqa: E402
from nv_engine.entrypoints.ray_serve.replica_header import REPLICA_HEADER  # noqa: E402

pytestmark = pytest.mark.timeout(420)   # a hang guard: the module takes well under a minute of CPU

MODEL = "tiny"
ENGINE_ARGS = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8,
                   num_gpu_blocks_override=64, block_size=16)
PROMPT = "The quick brown fox"


def _compile_ray_bytecode() -> None:
    """Ray's agent processes must start within the raylet's fixed timeout (15 s). Where bytecode is never
    written (PYTHONDONTWRITEBYTECODE=1, as on some CI machines) every one of them compiles Ray and its
    dependencies from source and misses it on a 2-core machine; compiling once here (a no-op when the
    bytecode is already there and current) avoids that."""
    import compileall
    import importlib.util

    for package in ("ray", "aiohttp", "grpc", "google.protobuf", "opencensus", "pydantic", "starlette",
                    "fastapi", "uvicorn", "msgpack", "yaml", "colorful", "smart_open", "prometheus_client"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                compileall.compile_dir(location, quiet=2, workers=2)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_app(tiny_qwen3_dir: Path):
    """Ray on loopback with two replicas of nv; yields the proxy's base URL."""
    _compile_ray_bytecode()
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=4,
             log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app({"model": str(tiny_qwen3_dir), "served_model_name": MODEL, "num_replicas": 2,
                         "ray_actor_options": {"num_cpus": 1}, "health_check_period_s": 1, **ENGINE_ARGS})
        serve.run(app, name="nv", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(ray_app: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=ray_app + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference_text(tiny_qwen3_dir: Path) -> str:
    from nv_engine import LLM, SamplingParams

    llm = LLM(str(tiny_qwen3_dir), **ENGINE_ARGS)
    return llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text


def test_two_replicas_serve_the_offline_greedy_text(client, reference_text):
    status = serve.status().applications["nv"]
    assert status.status == "RUNNING"
    assert status.deployments[DEPLOYMENT_NAME].replica_states == {"RUNNING": 2}
    assert [m.id for m in client.models.list().data] == [MODEL]

    replicas: set[str] = set()
    deadline = time.monotonic() + 30
    while len(replicas) < 2 and time.monotonic() < deadline:   # Ray's router picks a replica per request
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, temperature=0,
                                                          max_tokens=12, extra_body={"ignore_eos": True})
        assert raw.parse().choices[0].text == reference_text
        replicas.add(raw.headers[REPLICA_HEADER])
    assert len(replicas) == 2, f"only {replicas} answered"

    streamed = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == reference_text


def test_a_bad_request_gets_the_openai_error_through_ray(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)


def _replica_ids(client, count: int) -> set[str]:
    ids = set()
    for _ in range(count):
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=1)
        ids.add(raw.headers[REPLICA_HEADER])
    return ids


def test_a_replica_whose_engine_core_died_is_replaced(client, reference_text):
    """The engine core of one replica is killed: Ray's health check marks that replica unhealthy and starts
    a replacement, and the application ends up with two replicas answering the greedy text again."""
    psutil = pytest.importorskip("psutil")
    before = _replica_ids(client, 20)
    # Ray's processes descend from this one (ray.init started the node); a replica's engine core is its child
    replica = next(p for p in psutil.Process().children(recursive=True)
                   if any(f"ServeReplica:nv:{DEPLOYMENT_NAME}" in part for part in p.cmdline()))
    # the engine core is the replica's spawned child (the others: multiprocessing's resource tracker)
    (core,) = [child for child in replica.children() if "spawn_main" in " ".join(child.cmdline())]
    core.kill()
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        status = serve.status().applications["nv"].deployments[DEPLOYMENT_NAME]
        if status.replica_states == {"RUNNING": 2}:
            try:
                after = _replica_ids(client, 20)
            except openai.APIStatusError:   # the dead replica, before its health check failed
                after = set()
            if len(after) == 2 and after != before:
                break
        time.sleep(1)
    else:
        raise AssertionError(f"no replacement replica: {serve.status().applications['nv']}")
    assert len(after & before) == 1   # the healthy replica stayed, the other one is new
    answer = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12,
                                       extra_body={"ignore_eos": True})
    assert answer.choices[0].text == reference_text


# ---- build_app's args (no cluster needed) ---------------------------------------------------------------
def test_the_readme_config_is_a_valid_serve_config_that_builds():
    """The `serve run` config README.md shows: Ray's schema accepts it and build_app builds its args."""
    yaml = pytest.importorskip("yaml")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Serving on Ray Serve", 1)[1]
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    schema = serve.schema.ServeDeploySchema.parse_obj(config)
    (application,) = schema.applications
    assert application.import_path == "nv_engine.entrypoints.ray_serve:build_app"
    assert isinstance(build_app(application.args), serve.Application)
    options = RayAppArgs.from_builder_args(application.args).deployment_options
    assert options["ray_actor_options"] == {"num_gpus": 2}   # tensor_parallel_size GPUs per replica


def test_args_are_nv_serve_flags_plus_deployment_options():
    args = RayAppArgs.from_builder_args({
        "model": "/models/m", "tensor-parallel-size": "2", "served_model_name": ["a", "b"],
        "enable_prefix_caching": "false", "enable_auto_tool_choice": True, "tool_call_parser": "hermes",
        "kv_events_config": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"}, "seed": -1,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4}})
    ns = args.server_args
    assert (ns.model, ns.tensor_parallel_size, ns.served_model_name) == ("/models/m", 2, ["a", "b"])
    assert ns.enable_prefix_caching is False and ns.enable_auto_tool_choice is True and ns.seed == -1
    assert ns.kv_events_config == {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"}
    assert args.deployment_options == {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4},
                                       "ray_actor_options": {"num_gpus": 2}, "max_ongoing_requests": 512}
    on_cpu = RayAppArgs.from_builder_args({"model": "m", "device": "cpu", "max_num_seqs": 8,
                                           "ray_actor_options": {"num_cpus": 2}})
    assert on_cpu.deployment_options == {"ray_actor_options": {"num_cpus": 2, "num_gpus": 0},
                                         "max_ongoing_requests": 16}
    # `serve run nv_engine.entrypoints.ray_serve:build_app model=m num_replicas=2 ...`: every value is a string
    from_cli = RayAppArgs.from_builder_args({"model": "m", "num_replicas": "2", "max_ongoing_requests": "32",
                                             "ray_actor_options": '{"num_cpus": 2}', "max_model_len": "4096"})
    assert from_cli.server_args.max_model_len == 4096
    assert from_cli.deployment_options == {"num_replicas": 2, "max_ongoing_requests": 32,
                                           "ray_actor_options": {"num_cpus": 2, "num_gpus": 1}}


@pytest.mark.parametrize("args, message", [
    ({"served_model_name": "x"}, "needs `model`"),
    ({"model": "m", "no_such_flag": 1}, "unknown arg 'no_such_flag'"),
    ({"model": "m", "port": 8000}, "set by Ray Serve"),
    ({"model": "m", "max_num_seqs": "many"}, "invalid int value"),
    ({"model": "m", "enable_prefix_caching": "maybe"}, "takes true or false"),
    ({"model": "m", "max_in_flight_requests": 0}, "max_in_flight_requests must be at least 1"),
    ({"model": "m", "tool_call_parser": "nope"}, "invalid choice"),
    ({"model": "m", "num_replicas": "two"}, "num_replicas: cannot read 'two'"),
])
def test_bad_args_fail_before_any_replica_starts(args, message):
    with pytest.raises(ValueError, match=message):
        build_app(args)
