"""LLM / LLMEngine request handling on a tiny random Qwen3 (CPU): stop conditions and their
finish reasons, several EOS ids, bad input (ValueError, engine still usable), unknown keyword
arguments, abort, streaming outputs, recovery from an exception inside a step, and the KV-cache
size check at start."""
from __future__ import annotations

import itertools
import json
import shutil

import pytest

from nv_engine import LLM, LLMEngine, SamplingParams

PROMPT = [11, 45, 200, 7, 99, 150, 3, 64, 310, 12, 77, 5]




@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    engine = LLM(str(tiny_qwen3_dir))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference(llm):
    """The unconstrained greedy continuation of PROMPT (40 tokens) and its text."""
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0]


def _greedy(**kwargs) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 40, "ignore_eos": True, **kwargs})


def _first_new_token_index(tokens: list[int], start: int) -> int:
    return next(j for j in range(start, len(tokens)) if tokens[j] not in tokens[:j])


def _ascii_window(text: str, start: int, width: int = 3) -> str:
    for i in range(start, len(text) - width):
        window = text[i:i + width]
        if window.isascii() and window.isprintable() and window.strip() == window:
            return window
    pytest.skip("the random model produced no printable ASCII window")


def test_stop_string_truncates_text(llm, reference):
    stop = _ascii_window(reference.text, 6)
    cut = reference.text.find(stop)
    out = llm.generate([PROMPT], _greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == reference.text[:cut]
    assert reference.token_ids[:len(out.token_ids)] == out.token_ids and len(out.token_ids) < 40
    kept = llm.generate([PROMPT], _greedy(stop=[stop], include_stop_str_in_output=True), use_tqdm=False)
    assert kept[0].outputs[0].text == reference.text[:cut + len(stop)]


def test_stop_token_ids(llm, reference):
    j = _first_new_token_index(reference.token_ids, 4)
    token = reference.token_ids[j]
    out = llm.generate([PROMPT], _greedy(stop_token_ids=[token]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference.token_ids[:j + 1]
    assert out.finish_reason == "stop" and out.stop_reason == token


def test_min_tokens_holds_back_stops(llm, reference):
    token = reference.token_ids[0]
    out = llm.generate([PROMPT], _greedy(stop_token_ids=[token], min_tokens=5), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 5 and token not in out.token_ids[:5]
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == token
    early = llm.generate([PROMPT], _greedy(stop_token_ids=[token]), use_tqdm=False)[0].outputs[0]
    assert early.token_ids == [token] and early.finish_reason == "stop"


def test_max_tokens_and_max_model_len(tiny_qwen3_dir, llm, reference):
    out = llm.generate([PROMPT], _greedy(max_tokens=7), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference.token_ids[:7] and out.finish_reason == "length"
    short = LLM(str(tiny_qwen3_dir), max_model_len=20)
    try:
        capped = short.generate([PROMPT], _greedy(max_tokens=100), use_tqdm=False)[0].outputs[0]
        unbounded = short.generate([PROMPT], _greedy(max_tokens=None), use_tqdm=False)[0].outputs[0]
    finally:
        short.shutdown()
    assert capped.token_ids == reference.token_ids[:20 - len(PROMPT)] and capped.finish_reason == "length"
    assert unbounded.token_ids == capped.token_ids and unbounded.finish_reason == "length"


def test_every_generation_config_eos_stops(tiny_qwen3_dir, tmp_path, reference):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_qwen3_dir, model_dir)
    j = _first_new_token_index(reference.token_ids, 3)
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    original = gen.get("eos_token_id")
    gen["eos_token_id"] = [original if isinstance(original, int) else 0, reference.token_ids[j]]
    gen_path.write_text(json.dumps(gen))
    llm = LLM(str(model_dir))
    try:
        assert reference.token_ids[j] in llm.llm_engine.eos_token_ids
        assert llm.get_tokenizer().eos_token_id in llm.llm_engine.eos_token_ids
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)[0].outputs[0]
        ignored = llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0]
    finally:
        llm.shutdown()
    assert out.token_ids == reference.token_ids[:j + 1]
    assert out.finish_reason == "stop" and out.stop_reason is None
    assert ignored.token_ids == reference.token_ids


@pytest.mark.parametrize("bad_prompt", [
    list(range(1, 600)),          # longer than max_model_len (512)
    [1, 2, 384],                  # outside the vocabulary (384)
    [5, -1],
    [],
    "",
    {"prompt_token_ids": []},
    {"nothing": 1},
    3.5,
], ids=["too-long", "id-over-vocab", "negative-id", "empty-list", "empty-string", "empty-dict", "bad-dict", "float"])
def test_bad_prompt_raises_and_engine_stays_usable(llm, reference, bad_prompt):
    with pytest.raises(ValueError):
        llm.generate([PROMPT, bad_prompt], _greedy(), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.scheduler.block_manager.num_free_blocks == llm.llm_engine.num_blocks
    out = llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference.token_ids


def test_bad_sampling_params_raise(llm, reference):
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        llm.generate([PROMPT], {"temperature": 0.0}, use_tqdm=False)
    with pytest.raises(ValueError):
        llm.generate([PROMPT, PROMPT], [_greedy()], use_tqdm=False)
    assert llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0].token_ids == reference.token_ids


def test_unknown_and_bad_llm_arguments(tiny_qwen3_dir):
    with pytest.raises(TypeError):
        LLM(str(tiny_qwen3_dir), not_an_option=1)
    with pytest.raises(TypeError):
        LLMEngine(model=str(tiny_qwen3_dir), not_an_option=1)
    for bad in (dict(max_num_seqs=0), dict(gpu_memory_utilization=1.5), dict(dtype="int8"),
                dict(block_size=-16), dict(device="tpu")):
        with pytest.raises(ValueError):
            LLM(str(tiny_qwen3_dir), **bad)


def test_engine_streams_abort_and_frees_blocks(tiny_qwen3_dir, reference):
    engine = LLMEngine(model=str(tiny_qwen3_dir))
    engine.add_request("keep", PROMPT, _greedy())
    engine.add_request("drop", PROMPT[:5], _greedy())
    with pytest.raises(ValueError):
        engine.add_request("keep", PROMPT, _greedy())          # id in use
    seen: list[str] = []
    engine.step()
    engine.abort_request("drop")
    engine.abort_request("unknown")
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "keep"
            text = out.outputs[0].text
            assert text.startswith(seen[-1] if seen else "")   # full text so far, growing
            seen.append(text)
            final = out
    assert final.finished and final.outputs[0].token_ids == reference.token_ids
    assert final.outputs[0].text == reference.text
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
    engine.shutdown()


def test_chat_uses_the_template(llm):
    tokenizer = llm.get_tokenizer()
    messages = [{"role": "user", "content": "Hello, world!"}]
    out = llm.chat(messages, _greedy(max_tokens=5), use_tqdm=False)[0]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt == expected
    assert out.prompt_token_ids == tokenizer.encode(expected, add_special_tokens=False)
    assert len(out.outputs[0].token_ids) == 5


def test_async_scheduling_equals_synchronous(tiny_qwen3_dir, reference):
    """Scheduling step N+1 before step N's ids are back changes nothing in the outputs, also for
    sequences that stop on an id or a string (they compute one extra token, dropped), n > 1,
    seeded sampling, logprobs, and a penalty request (which turns the overlap off while it runs)."""
    stop = _ascii_window(reference.text, 4)
    token = reference.token_ids[_first_new_token_index(reference.token_ids, 3)]
    prompts = [PROMPT, PROMPT, PROMPT[:7], PROMPT[3:], PROMPT, PROMPT[:9]]
    params = [_greedy(stop=[stop]), _greedy(stop_token_ids=[token], min_tokens=2),
              SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=25, ignore_eos=True),
              _greedy(max_tokens=13, logprobs=2), _greedy(stop_token_ids=[token]),
              SamplingParams(temperature=0.7, seed=5, max_tokens=30, repetition_penalty=1.3, ignore_eos=True)]
    results = {}
    for mode in (False, True):
        llm = LLM(str(tiny_qwen3_dir), async_scheduling=mode, max_num_batched_tokens=32)
        assert llm.llm_engine.async_scheduling is mode
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert llm.llm_engine.scheduler.block_manager.num_free_blocks == llm.llm_engine.num_blocks
        llm.shutdown()
        results[mode] = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob)
                          for c in o.outputs] for o in outputs]
    assert results[True] == results[False]
    assert results[True][0][0][2:4] == ("stop", stop) and results[True][4][0][2:4] == ("stop", token)


RECOVERY_PROMPTS = [PROMPT, PROMPT[:7], PROMPT[2:]]
RECOVERY_PARAMS = [_greedy(), SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=25, ignore_eos=True),
                   _greedy(max_tokens=13, logprobs=2)]


def _completions(outputs):
    """Tokens, text, finish reason and logprob (rounded: another batch split moves the last digits)."""
    return [[(c.token_ids, c.text, c.finish_reason, None if c.cumulative_logprob is None
              else round(c.cumulative_logprob, 3)) for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("async_scheduling, method, error, failing_call", [
    (True, "collect", KeyboardInterrupt, 3),   # step 3's ids lost while step 4 is in flight
    (True, "launch", KeyboardInterrupt, 3),    # step 3 never launched, step 2's ids not yet back
    (True, "collect", RuntimeError, 4),
    (False, "execute", KeyboardInterrupt, 3),
], ids=["async-collect-interrupt", "async-launch-interrupt", "async-collect-error", "sync-execute-interrupt"])
def test_exception_inside_a_step_leaves_the_engine_consistent(tiny_qwen3_dir, llm, monkeypatch, async_scheduling,
                                                             method, error, failing_call):
    """The interrupted call's requests are aborted and their blocks freed, the step in flight is
    dropped, and the next generate gives what a fresh engine gives."""
    expected = _completions(llm.generate(RECOVERY_PROMPTS, RECOVERY_PARAMS, use_tqdm=False))
    other = LLM(str(tiny_qwen3_dir), async_scheduling=async_scheduling, max_num_batched_tokens=32)
    try:
        engine = other.llm_engine
        executor = engine.executor
        real = getattr(executor, method)
        calls = itertools.count(1)

        def fail_once(*args):
            if next(calls) == failing_call:
                raise error("injected failure")
            return real(*args)

        monkeypatch.setattr(executor, method, fail_once)
        with pytest.raises(error, match="injected failure"):
            other.generate(RECOVERY_PROMPTS, RECOVERY_PARAMS, use_tqdm=False)
        assert not engine.has_unfinished_requests() and not engine.scheduler.has_unfinished()
        assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
        again = other.generate(RECOVERY_PROMPTS, RECOVERY_PARAMS, use_tqdm=False)
        assert _completions(again) == expected
        assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
    finally:
        other.shutdown()


def test_streaming_engine_step_failure_aborts_only_the_step_requests(tiny_qwen3_dir, reference, monkeypatch):
    """A failing LLMEngine.step() aborts the requests it had scheduled; a request still waiting
    keeps its place and finishes as usual."""
    engine = LLMEngine(model=str(tiny_qwen3_dir), max_num_seqs=1)
    try:
        engine.add_request("running", PROMPT, _greedy())
        engine.add_request("waiting", PROMPT, _greedy())
        engine.step()
        real = engine.executor.collect
        calls = itertools.count(1)

        def fail_once():
            if next(calls) == 2:
                raise RuntimeError("injected failure")
            return real()

        monkeypatch.setattr(engine.executor, "collect", fail_once)
        with pytest.raises(RuntimeError, match="injected failure"):
            while True:
                engine.step()
        assert engine.get_num_unfinished_requests() == 1
        finals = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
        assert list(finals) == ["waiting"] and finals["waiting"].outputs[0].token_ids == reference.token_ids
        assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
    finally:
        engine.shutdown()


def test_kv_cache_smaller_than_one_sequence_is_refused(tiny_qwen3_dir):
    with pytest.raises(ValueError) as info:
        LLMEngine(model=str(tiny_qwen3_dir), num_gpu_blocks_override=4, block_size=16)   # 64 < 512 tokens
    for knob in ("gpu_memory_utilization", "max_model_len", "num_gpu_blocks_override"):
        assert knob in str(info.value)
    engine = LLMEngine(model=str(tiny_qwen3_dir), num_gpu_blocks_override=4, block_size=16, max_model_len=64)
    assert engine.num_blocks == 4
    engine.shutdown()
