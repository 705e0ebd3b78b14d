"""AsyncLLM: the engine core in its own process, requests from asyncio (one AsyncLLM for the module,
a tiny random Qwen3 on CPU). Greedy tokens equal the offline LLM's; closing a generator early
aborts the request in the core and frees its blocks; 256 streams at once all finish."""
from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import time
from pathlib import Path

import pytest

from nv_engine import LLM, AsyncLLM, SamplingParams
from nv_engine.config.engine_args import EngineArgs
from nv_engine.engine.core_client import EngineCoreClient
from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.engine.engine_requests import eos_token_ids

pytestmark = pytest.mark.timeout(300)

ENGINE_KWARGS = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=256,
                     num_gpu_blocks_override=1024, block_size=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


# each time the frontend read the model's config while the module's AsyncLLM started: whether the engine-core
# process came up during that read (waited for up to 30 s)
CORE_UP_DURING_CONFIG: list[bool] = []


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: Path):
    read_config = EngineArgs.create_engine_config

    def recorded(self: EngineArgs, hf_config: object = None):
        deadline = time.monotonic() + 30
        while not _core_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        CORE_UP_DURING_CONFIG.append(bool(_core_children()))
        return read_config(self, hf_config)

    with pytest.MonkeyPatch.context() as patch:    # this process only: the core imports its own modules
        patch.setattr(EngineArgs, "create_engine_config", recorded)
        engine = AsyncLLM(str(tiny_qwen3_dir), **ENGINE_KWARGS)
    yield engine
    engine.shutdown()


def _core_children() -> list[str]:
    return [child.name for child in multiprocessing.active_children() if child.name == "nv-engine-core"]


def _prompts(count: int) -> list[list[int]]:
    return [[(7 * i + j) % 300 + 1 for j in range(5 + i % 7)] for i in range(count)]


async def _last(llm: AsyncLLM, prompt: list[int], params: SamplingParams, request_id: str):
    last = None
    async for output in llm.generate(prompt, params, request_id):
        assert last is None or len(output.outputs[0].token_ids) >= len(last.outputs[0].token_ids)
        last = output
    assert last is not None and last.finished
    return last


async def _wait_idle(llm: AsyncLLM, timeout: float = 20.0) -> None:
    """Until the core holds no request and every KV block is free (aborts are asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unfinished = await llm.call_utility("get_num_unfinished_requests")
        free = await llm.call_utility("get_num_free_blocks")
        if unfinished == 0 and free == llm.num_blocks:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"core not idle: {unfinished} unfinished, {free} of {llm.num_blocks} blocks free")


def test_concurrent_generators_match_the_offline_llm(llm, tiny_qwen3_dir):
    prompts = _prompts(8)

    async def run():
        outs = await asyncio.gather(*[_last(llm, p, GREEDY, f"greedy-{i}") for i, p in enumerate(prompts)])
        await _wait_idle(llm)
        return outs

    outs = asyncio.run(run())
    offline = LLM(str(tiny_qwen3_dir), **ENGINE_KWARGS)
    try:
        expected = offline.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        offline.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == [e.outputs[0].token_ids for e in expected]
    assert [o.outputs[0].text for o in outs] == [e.outputs[0].text for e in expected]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_a_non_streamed_request_decodes_its_text_once_at_the_end(llm):
    """stream=False: the text is decoded once, at the end (same tokens and text as streamed)."""
    prompt = _prompts(3)[2]

    async def run():
        streamed = await _last(llm, prompt, GREEDY, "streamed")
        stream = await llm.add_requests([("final-only", prompt, GREEDY)], stream=False)
        waits = [outputs async for outputs in stream]
        await _wait_idle(llm)
        return streamed, waits

    streamed, waits = asyncio.run(run())
    outputs = [output for wait in waits for output in wait]
    final = outputs[-1]
    assert all(output.outputs[0].text == "" and not output.finished for output in outputs[:-1])
    assert final.finished and final.outputs[0].finish_reason == "length"
    assert final.outputs[0].token_ids == streamed.outputs[0].token_ids
    assert final.outputs[0].text == streamed.outputs[0].text


def test_stream_interval_sends_fewer_outputs_with_the_same_tokens(llm):
    """The default stream_interval (2): a 12-token stream gets its first token, then one output per 2 tokens
    (at most 7 outputs). Set to 4 on the module's frontend: at most 4 outputs. Set to 1: one per token. The
    tokens and text are the same each time."""
    prompt = _prompts(4)[3]

    async def run(request_id: str):
        stream = await llm.add_requests([(request_id, prompt, GREEDY)], stream=True)
        outputs = [output for outputs in [outputs async for outputs in stream] for output in outputs]
        await _wait_idle(llm)
        return outputs

    default_interval = llm.output_processor.stream_interval
    assert default_interval == 2
    runs = {}
    try:
        for interval in (2, 4, 1):
            llm.output_processor.stream_interval = interval
            runs[interval] = asyncio.run(run(f"every-{interval}"))
    finally:
        llm.output_processor.stream_interval = default_interval
    for interval, most in ((2, 7), (4, 4)):
        outputs = runs[interval]
        counts = [len(output.outputs[0].token_ids) for output in outputs]
        assert len(outputs) <= most and counts[-1] == 12 and outputs[-1].finished
        assert all(b - a >= interval for a, b in zip(counts[:-2], counts[1:-1], strict=True))
        assert counts[0] <= 2
        assert outputs[-1].outputs[0].token_ids == runs[1][-1].outputs[0].token_ids
        assert outputs[-1].outputs[0].text == runs[1][-1].outputs[0].text
    assert len(runs[1]) > len(runs[2]) > len(runs[4])


def test_stop_string_ends_the_request_in_the_core(llm):
    async def run():
        free_text = (await _last(llm, [5, 6, 7], GREEDY, "free")).outputs[0].text
        assert len(free_text) > 2
        stop = free_text[1:3]
        params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True, stop=[stop])
        out = await _last(llm, [5, 6, 7], params, "stopped")
        await _wait_idle(llm)     # the core finished it too (no 200-token run left behind)
        return free_text, stop, out

    free_text, stop, out = asyncio.run(run())
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert free_text.startswith(out.outputs[0].text) and stop not in out.outputs[0].text


def test_closing_a_generator_early_aborts_the_request_in_the_core(llm):
    long_run = SamplingParams(temperature=0.0, max_tokens=240, ignore_eos=True)

    async def run():
        generator = llm.generate(list(range(1, 10)), long_run, "left-early")
        async for output in generator:
            assert not output.finished
            break
        await generator.aclose()
        await _wait_idle(llm)
        # an explicit abort of a running request, and a request cancelled while it waits
        task = asyncio.ensure_future(_last(llm, [3, 4, 5], long_run, "cancelled"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_idle(llm)
        # the engine still serves
        return await _last(llm, [1, 2, 3], GREEDY, "after")

    assert len(asyncio.run(run()).outputs[0].token_ids) == GREEDY.max_tokens


def test_256_concurrent_streams_finish_and_free_every_block(llm):
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=8, ignore_eos=True)

    async def run():
        outs = await asyncio.gather(*[_last(llm, p, params, f"wide-{i}") for i, p in enumerate(_prompts(256))])
        await _wait_idle(llm)
        return outs

    outs = asyncio.run(run())
    assert len(outs) == 256 and all(len(o.outputs[0].token_ids) == 8 for o in outs)
    assert llm.max_step_batch_size > 1


def test_bad_requests_raise_and_leave_the_engine_usable(llm):
    async def run():
        with pytest.raises(ValueError, match="max_model_len"):
            await llm.add_requests([("too-long", list(range(1, 300)), GREEDY)])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await llm.add_requests([("bad-id", [10**6], GREEDY)])
        await _last(llm, [1, 2], GREEDY, "dup")
        return await _last(llm, [1, 2], GREEDY, "dup")   # a finished id may be reused

    assert asyncio.run(run()).finished


def test_a_core_that_fails_to_start_raises_its_message(tiny_qwen3_dir):
    with pytest.raises(RuntimeError, match="fewer than one max_model_len"):
        AsyncLLM(str(tiny_qwen3_dir), **{**ENGINE_KWARGS, "num_gpu_blocks_override": 4})


def test_the_core_starts_before_the_frontend_reads_the_model_config(llm):
    """The core resolves the engine arguments itself (config, EOS ids), so it builds while the frontend reads
    the same config and tokenizer; READY names what it resolved, and both sides agree."""
    assert CORE_UP_DURING_CONFIG and CORE_UP_DURING_CONFIG[0]
    assert llm.client.ready["max_model_len"] == llm.config.max_model_len == ENGINE_KWARGS["max_model_len"]
    assert llm.client.ready["eos_token_ids"] == sorted(eos_token_ids(llm.config, llm.tokenizer))


def test_a_core_that_resolved_other_limits_is_refused_and_stopped(tiny_qwen3_dir):
    args = EngineArgs.from_kwargs(str(tiny_qwen3_dir), **ENGINE_KWARGS).with_resolved_paths()
    other = dataclasses.replace(args, max_model_len=128).create_engine_config()
    client = EngineCoreClient(args, None, on_outputs=lambda outputs: None, on_dead=lambda reason: None)
    with pytest.raises(RuntimeError, match="resolved the engine arguments differently"):
        client.wait_ready(other, eos_token_ids(other, None))
    assert not client.process.is_alive()


def test_bad_engine_arguments_raise_and_leave_no_core_running(tiny_qwen3_dir, llm):
    """The core started before the frontend found the bad value: it is stopped at once, not left building."""
    before = len(_core_children())      # the module's AsyncLLM
    started = time.monotonic()
    with pytest.raises(ValueError, match="max_model_len must be a positive integer"):
        AsyncLLM(str(tiny_qwen3_dir), **{**ENGINE_KWARGS, "max_model_len": 0})
    assert len(_core_children()) == before
    assert time.monotonic() - started < 30


def test_adding_requests_never_waits_for_the_receivers_lock(llm):
    """The receiver thread holds the output lock while it processes a step (milliseconds at a full
    batch): requests added meanwhile are queued without waiting for it, so a wave of arrivals does not
    stall the event loop, and they still stream once the step is processed. An id in use is refused
    even before its request is registered."""
    import threading

    async def run():
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with llm._lock:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(5)
        started = time.monotonic()
        streams = [await llm.add_requests([(f"queued-{i}", p, GREEDY)]) for i, p in enumerate(_prompts(32))]
        added_in = time.monotonic() - started
        with pytest.raises(ValueError, match="already in use"):
            await llm.add_requests([("queued-0", [1, 2], GREEDY)])
        release.set()
        holder.join()
        finals = []
        for stream in streams:
            async for outputs in stream:
                finals.extend(o for o in outputs if o.finished)
        await _wait_idle(llm)
        return added_in, finals

    added_in, finals = asyncio.run(run())
    assert added_in < 2.0, f"adding waited {added_in:.2f} s for the lock"
    assert sorted(o.request_id for o in finals) == sorted(f"queued-{i}" for i in range(32))
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in finals)


def test_shutdown_ends_the_core_and_later_calls_raise(llm):
    """The module's AsyncLLM (this test runs last)."""
    process = llm.client.process
    llm.shutdown()
    assert not process.is_alive() and not llm.is_running

    async def run():
        with pytest.raises(EngineDeadError):
            await llm.add_requests([("late", [1, 2], GREEDY)])

    asyncio.run(run())

