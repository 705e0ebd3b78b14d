"""The engine core's request bookkeeping (RequestTable) driven through an EngineCore whose runner
only stages inputs (HostOnlyRunner: no model, so steps cost milliseconds): n > 1 completions, the
updates streamed and final, first-scheduled times, aborts mid-flight, and a clean core afterwards."""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest

from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core import EngineCore
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.executor.uniproc import UniProcExecutor
from nv_engine.model_loader.random_model import qwen3_config
from nv_engine.runner.host_only_runner import HostOnlyRunner
from nv_engine.sampling_params import SamplingParams
from nv_kvcache import FinishReason


@pytest.fixture(scope="module")
def core() -> Iterator[EngineCore]:
    config = EngineConfig(model="host-only", hf_config=qwen3_config("tiny"), max_model_len=256, block_size=16,
                          max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks_override=40)
    engine = EngineCore(config, [0], record_timestamps=True, executor=UniProcExecutor(config, HostOnlyRunner))
    yield engine
    engine.shutdown()


def _request(request_id: str, prompt_len: int, *, streams: bool, **params: object) -> EngineCoreRequest:
    sampling = SamplingParams(ignore_eos=True, temperature=0.8, seed=1, **params)  # type: ignore[arg-type]
    sampling.prepare_for_model(512, None)
    return EngineCoreRequest(request_id, [(7 * i) % 500 + 1 for i in range(prompt_len)], sampling, streams,
                             time.monotonic())


def _run(core: EngineCore, abort_after: dict[str, int] | None = None, max_steps: int = 500):
    """Step until idle; per (request, completion) the tokens and finish reasons reported, the number of
    updates, and how often each request was reported as first scheduled."""
    tokens: dict[tuple[str, int], list[int]] = defaultdict(list)
    finishes: dict[tuple[str, int], list[FinishReason]] = defaultdict(list)
    updates: Counter[tuple[str, int]] = Counter()
    first_scheduled: Counter[str] = Counter()
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            break
        outputs = core.step_outputs()
        first_scheduled.update(outputs.first_scheduled.keys())
        for update in outputs.updates:
            key = (update.request_id, update.completion_index)
            tokens[key] += update.new_token_ids
            updates[key] += 1
            if update.finish_reason is not None:
                finishes[key].append(update.finish_reason)
        for request_id, steps in (abort_after or {}).items():
            if updates[(request_id, 0)] == steps:
                core.abort_requests([request_id])
    return tokens, finishes, updates, first_scheduled


def test_every_completion_reported_once_finished_and_the_core_forgets_the_request(core):
    core.add_request(_request("three", 40, streams=True, n=3, max_tokens=12))
    core.add_request(_request("final-only", 70, streams=False, max_tokens=9))
    core.add_request(_request("streamed", 5, streams=True, max_tokens=20))
    with pytest.raises(ValueError, match="already in use"):
        core.add_request(_request("three", 3, streams=True))
    tokens, finishes, updates, first_scheduled = _run(core)
    expected = {("three", 0): 12, ("three", 1): 12, ("three", 2): 12, ("final-only", 0): 9, ("streamed", 0): 20}
    assert {key: len(ids) for key, ids in tokens.items()} == expected
    assert all(reasons == [FinishReason.LENGTH] for reasons in finishes.values()) and len(finishes) == 5
    assert updates[("final-only", 0)] == 1                  # reported once, with every token
    assert updates[("streamed", 0)] == 20                   # one update per token
    assert first_scheduled == {"three": 1, "final-only": 1, "streamed": 1}
    assert len(core.requests) == 0 and not core.scheduler.has_unfinished()
    assert core.requests.num_penalty_requests == 0 and core.requests.num_prompt_logprobs_requests == 0
    assert core.get_num_free_blocks() == core.num_blocks


def test_an_abort_mid_flight_stops_the_updates_and_frees_everything(core):
    core.add_request(_request("kept", 30, streams=True, max_tokens=15))
    core.add_request(_request("aborted", 30, streams=True, n=2, max_tokens=50))
    core.add_request(_request("penalised", 10, streams=True, max_tokens=8, presence_penalty=0.5))
    assert core.requests.num_penalty_requests == 1
    tokens, finishes, updates, _ = _run(core, abort_after={"aborted": 4})
    assert len(tokens[("kept", 0)]) == 15 and len(tokens[("penalised", 0)]) == 8
    assert updates[("aborted", 0)] == 4 and not finishes[("aborted", 0)]
    assert "aborted" not in core.requests and len(core.requests) == 0
    assert core.requests.num_penalty_requests == 0
    assert core.get_num_free_blocks() == core.num_blocks
