"""Structured outputs offline (`SamplingParams(structured_outputs=...)`, xgrammar): even random weights
must write output that parses and validates against the JSON schema, matches the regex, is one of the
choices or follows the grammar, and finish with "stop" (every constraint here is bounded, so a
"length" finish is a failure). A batch mixing grammar and plain requests leaves the plain ones
unchanged (greedy). A bad constraint is a ValueError at add time and the engine keeps serving; a
compile that fails later finishes its request (abort) without a hang. SmolLM2 (real weights): JSON
answers to chat prompts that validate.

Grammar steps keep async scheduling (the forward of step N+1 runs while step N's ids are accepted
and N+1's bitmask fills; ModelRunner.sample follows): the tokens equal those of synchronous steps
(mixed batches, grammars that end mid-batch, n > 1, sampled rows), an abort while a step waits for
its bitmask leaves no state behind, and a failing fill aborts the step's requests, not the engine.

xgrammar's JSON-schema strings admit raw control characters, which strict JSON forbids, so outputs are
parsed with json.loads(strict=False); the schemas' shapes, bounds and enums are still checked.
"""
from __future__ import annotations

import json
import os
import re
import signal
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from json_schemas import SCHEMAS  # noqa: E402

from nv_engine import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from nv_engine.core.engine_sequence import EngineSequence  # noqa: E402
from nv_engine.structured_output.compiler import GrammarCompiler  # noqa: E402
from nv_engine.structured_output.local_matchers import LocalMatchers, fill_threads_for  # noqa: E402
from nv_engine.structured_output.manager import StructuredOutputManager  # noqa: E402
from nv_engine.structured_output.matcher_process import MatcherProcess, MatcherReply  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

MAX_TOKENS = 160
PROMPTS = ["The quick brown fox", "Hello, world!", "def main():", "1 2 3"]

@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: Path):
    with LLM(str(tiny_qwen3_dir), max_model_len=512, max_num_seqs=16, block_size=16) as engine:
        yield engine


def constrained(seed: int | None = None, temperature: float = 0.0, **constraint) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=MAX_TOKENS,
                          structured_outputs=StructuredOutputsParams(**constraint))


def finished_text(output) -> str:
    completion = output.outputs[0]
    assert completion.finish_reason == "stop", (completion.finish_reason, completion.text)
    return completion.text


def test_json_schemas_validate_greedy_and_sampled(llm):
    params = [constrained(json=schema) for schema in SCHEMAS]
    params += [constrained(seed=i, temperature=1.0, json=schema) for i, schema in enumerate(SCHEMAS)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for output, schema in zip(outputs, SCHEMAS * 2, strict=True):
        value = json.loads(finished_text(output), strict=False)
        jsonschema.validate(value, schema)


def test_json_schema_given_as_text_and_json_object(llm):
    schema = SCHEMAS[1]
    out = llm.generate([PROMPTS[0]], constrained(json=json.dumps(schema)), use_tqdm=False)[0]
    jsonschema.validate(json.loads(finished_text(out), strict=False), schema)
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=(
        StructuredOutputsParams(json_object=True))), use_tqdm=False)[0]
    text = out.outputs[0].text
    assert text.startswith("{")
    if out.outputs[0].finish_reason == "stop":      # random weights may nest past the token budget
        assert isinstance(json.loads(text, strict=False), dict)


def test_regex_choice_and_grammar(llm):
    regex = r"(yes|no)-[0-9]{1,3}"
    choices = ["apple pie", "banana", "cherry \"quoted\" é"]
    grammar = 'root ::= "(" digit ("+" digit)* ")"\ndigit ::= [0-9]'
    params = [constrained(regex=regex), constrained(seed=1, temperature=1.0, regex=regex),
              constrained(choice=choices), constrained(seed=2, temperature=1.0, choice=choices),
              constrained(seed=3, temperature=1.0, choice=choices), constrained(grammar=grammar),
              constrained(seed=4, temperature=1.0, grammar=grammar)]
    outputs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(params))], params, use_tqdm=False)
    texts = [finished_text(o) for o in outputs]
    assert all(re.fullmatch(regex, t) for t in texts[:2]), texts
    assert all(t in choices for t in texts[2:5]), texts
    assert all(re.fullmatch(r"\([0-9](\+[0-9])*\)", t) for t in texts[5:]), texts


def test_mixed_batch_leaves_plain_requests_unchanged(llm):
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain, use_tqdm=False)]
    params = [plain, constrained(json=SCHEMAS[0]), plain, constrained(regex="[a-z]{4}"), plain,
              constrained(choice=["x", "y"]), plain]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[2], PROMPTS[3], PROMPTS[3]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [outputs[i].outputs[0].token_ids for i in (0, 2, 4, 6)] == alone
    jsonschema.validate(json.loads(finished_text(outputs[1]), strict=False), SCHEMAS[0])
    assert re.fullmatch("[a-z]{4}", finished_text(outputs[3]))
    assert finished_text(outputs[5]) in ("x", "y")


def test_n_ignore_eos_and_stream_steps(llm):
    """n > 1 gives each completion its own matcher; ignore_eos still ends when the grammar is done."""
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=MAX_TOKENS, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json=SCHEMAS[6]))
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0]
    assert len(out.outputs) == 3
    for completion in out.outputs:
        assert completion.finish_reason == "stop"
        jsonschema.validate(json.loads(completion.text, strict=False), SCHEMAS[6])


@pytest.mark.parametrize("constraint, message", [
    ({"json": {"type": "object", "properties": 3}}, "invalid json"),
    ({"regex": "a(b"}, "invalid regex"),
    ({"grammar": "root ::= undefined_rule"}, "invalid grammar"),
])
def test_bad_constraint_is_a_value_error_and_the_engine_keeps_serving(llm, constraint, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["x", "y"], [SamplingParams(max_tokens=4),
                                  SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate(["x"], constrained(choice=["ok"]), use_tqdm=False)[0]
    assert finished_text(out) == "ok"


def test_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputsParams(json="{nope")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    params = SamplingParams(structured_outputs={"json": '{"type": "integer"}'})
    assert params.structured_outputs == StructuredOutputsParams(json={"type": "integer"})
    assert not params.needs_output_token_ids  # keeps async scheduling (the bitmask overlaps the forward)


def test_the_engines_copy_of_a_constraint_keeps_it_as_added():
    """SamplingParams.clone (the engine's copy of a request's params) copies the schema or choices:
    the caller's later edits of theirs change nothing the engine compiles."""
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "string", "maxLength": 4},
                                                                  "b": {"enum": [1, 2.5, True, None]}}}
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
    choices = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    key, choice_key = params.structured_outputs.cache_key, choices.structured_outputs.cache_key
    kept, kept_choices = params.clone(), choices.clone()
    schema["properties"]["a"]["maxLength"] = 1
    schema["required"].append("b")
    schema["properties"]["b"]["enum"].pop()
    choices.structured_outputs.choice.append("maybe")
    assert kept.structured_outputs.cache_key == key and kept_choices.structured_outputs.cache_key == choice_key
    assert kept.structured_outputs.json["properties"]["b"]["enum"] == [1, 2.5, True, None]
    assert params.structured_outputs.cache_key != key


def test_failed_compile_finishes_the_request_without_a_hang(llm, monkeypatch):
    def broken(self, grammar):
        raise ValueError("structured_outputs: the grammar does not compile: broken")

    monkeypatch.setattr(GrammarCompiler, "_compile", broken)
    out = llm.generate(["x"], constrained(regex="never-compiled-[0-9]"), use_tqdm=False)[0]
    assert out.finished and out.outputs[0].finish_reason == "abort"
    monkeypatch.undo()
    assert finished_text(llm.generate(["x"], constrained(regex="fine-[0-9]"), use_tqdm=False)[0])


# ---- grammar steps under async scheduling ------------------------------------------------------
def test_overlapped_grammar_steps_give_the_tokens_of_synchronous_steps(llm, monkeypatch):
    """Grammar and plain rows, greedy and seeded, n > 1, and a choice grammar that ends after a few
    steps while the rest run on: the same tokens and finish reasons with async scheduling (bitmask
    filled while the forward runs) as with every step synchronous."""
    core = llm.llm_engine.core
    plain = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    params = [constrained(json=SCHEMAS[0]), plain, constrained(seed=3, temperature=1.0, json=SCHEMAS[6]),
              constrained(choice=["x", "yes"]), SamplingParams(temperature=1.0, seed=11, max_tokens=30),
              SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True,
                             structured_outputs=StructuredOutputsParams(json=SCHEMAS[2])),
              constrained(regex="[a-z]{3,30}", seed=5, temperature=1.0)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    executor = core.live_executor()
    sampled_apart = []
    sample = executor.sample
    monkeypatch.setattr(executor, "sample", lambda bitmask: (sampled_apart.append(bitmask), sample(bitmask))[1])

    def run() -> list[tuple[list[int], str | None]]:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [(list(c.token_ids), c.finish_reason) for o in outputs for c in o.outputs]

    overlapped = run()               # the default fill (in the engine's thread)
    assert len(sampled_apart) > 10 and any(b is not None for b in sampled_apart)   # the overlap ran
    manager = core.structured_outputs
    try:
        manager.use_matcher_process = True          # accepted and filled in the matcher process
        assert manager.start_matcher_process().wait_ready(120)
        assert run() == overlapped
        process = manager.matcher_process
        assert process is not None and process.alive
        manager.use_matcher_process = False          # back in the engine's thread; the process waits idle
        manager.local.fill_threads = 2               # a fill on several threads
        assert run() == overlapped
        manager.use_matcher_process, manager.local.fill_threads = True, None
        assert run() == overlapped and manager.matcher_process is process   # the same process again
    finally:
        manager.use_matcher_process, manager.local.fill_threads = False, None
    assert core.async_scheduling
    core.async_scheduling = False            # every step synchronous, the bitmask filled before it
    try:
        sampled_apart.clear()
        synchronous = run()
    finally:
        core.async_scheduling = True
    assert not sampled_apart
    assert overlapped == synchronous
    assert overlapped[3][1] == "stop" and len(overlapped[3][0]) <= 4     # the choice (and EOS) ended early
    assert all(reason == "stop" for _, reason in overlapped[5:8])       # grammars end ignore_eos rows


def test_the_matcher_process_fills_while_the_engine_thread_launches(llm, monkeypatch):
    """With the matchers in their own process, the engine's thread runs no xgrammar call: it sends each
    step's job (the previous step's ids, the step's rows) before it launches that step, launches it and
    builds the next step's inputs while the process accepts and fills, and samples only once it read
    the reply."""
    core = llm.llm_engine.core
    manager = core.structured_outputs
    executor = core.live_executor()
    events: list[str] = []
    prepare, launch, sample = core._prepare, executor.launch, executor.sample
    send, wait = MatcherProcess.fill, MatcherReply.result

    def record(name, method):
        def recorded(*args):
            events.append(name)
            return method(*args)
        return recorded

    def no_xgrammar_here(*args):
        raise AssertionError("xgrammar ran in the engine's thread")

    monkeypatch.setattr(LocalMatchers, "_fill", staticmethod(no_xgrammar_here))
    monkeypatch.setattr(MatcherProcess, "fill",
                        lambda self, rows, then=None: (events.append("job sent"), send(self, rows, then))[1])
    monkeypatch.setattr(MatcherReply, "result", lambda self: (events.append("reply"), wait(self))[1])
    monkeypatch.setattr(core, "_prepare", record("prepare", prepare))
    monkeypatch.setattr(executor, "launch", record("launch", launch))
    monkeypatch.setattr(executor, "sample", record("sample", sample))
    manager.use_matcher_process = True
    assert manager.start_matcher_process().wait_ready(120)
    try:
        outputs = llm.generate(PROMPTS[:3], [constrained(json=SCHEMAS[i]) for i in range(3)], use_tqdm=False)
    finally:
        monkeypatch.undo()
        if not manager.active:               # (a failure above may leave requests behind)
            manager.use_matcher_process = False
    for i, output in enumerate(outputs):
        jsonschema.validate(json.loads(finished_text(output), strict=False), SCHEMAS[i])
    overlapped = 0
    for i, name in enumerate(events):
        if name != "job sent":
            continue
        end = events.index("reply", i + 1)
        # the engine's thread launched the step the job fills for, and built the next one, meanwhile
        overlapped += "launch" in events[i:end] and "prepare" in events[i:end]
        assert "sample" not in events[i:end]        # sampling waits for the reply
    assert overlapped >= 5


@pytest.mark.parametrize("unanswered", [False, True], ids=["between-steps", "job-unanswered"])
def test_a_dead_matcher_process_fails_its_requests_not_the_engine(llm, unanswered):
    """The matcher process killed mid-run: the requests whose matchers it held fail (the step raises),
    the engine keeps serving, and the next grammar request gets a new process. job-unanswered: it dies
    after a step's job was sent and before it answered (the step fails where it waits for the bitmask)."""
    engine = llm.llm_engine
    core = engine.core
    manager = core.structured_outputs
    manager.use_matcher_process = True
    assert manager.start_matcher_process().wait_ready(120)
    try:
        for i in range(3):
            engine.add_request(f"killed-{i}", PROMPTS[i], constrained(seed=i, temperature=1.0, json=SCHEMAS[0]))
        while manager.num_held or not manager.active:
            engine.step()
        for _ in range(2):
            engine.step()
        process = manager.matcher_process
        assert process is not None and process.alive
        assert process.buffer_path is not None and not Path(process.buffer_path).exists()   # mapped, then unlinked
        if unanswered:
            def send_then_die(rows, then=None):
                del process.fill                                 # once: the class's fill serves again
                process.wait_for(process._job_id)                # the child is idle: no reply on its way
                os.kill(process._process.pid, signal.SIGSTOP)    # it cannot answer the job sent now
                reply = process.fill(rows, then)
                process._process.kill()
                process._process.join()
                return reply

            process.fill = send_then_die
        else:
            process._process.kill()
            process._process.join()
        with pytest.raises(RuntimeError, match="matcher process"):
            while engine.has_unfinished_requests():
                engine.step()
        assert not engine.has_unfinished_requests()
        assert core.get_num_free_blocks() == core.num_blocks
        out = llm.generate([PROMPTS[0]], constrained(json=SCHEMAS[1]), use_tqdm=False)[0]
        jsonschema.validate(json.loads(finished_text(out), strict=False), SCHEMAS[1])
        assert manager.matcher_process is not None and manager.matcher_process is not process
    finally:
        if not manager.active:               # (a failure above may leave requests behind)
            manager.use_matcher_process = False


def test_switching_async_scheduling_off_with_a_grammar_step_in_flight(llm):
    """A grammar run ends with a step in flight (launched before the ids that end the grammars came
    back). Switching async scheduling off then (between runs) collects that step first: the next
    run gets its own ids, the tokens of a clean start."""
    core = llm.llm_engine.core
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    clean = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain, use_tqdm=False)]
    texts = [finished_text(o) for o in llm.generate(PROMPTS, constrained(choice=["yes", "no way"]),
                                                    use_tqdm=False)]
    assert set(texts) <= {"yes", "no way"}
    assert core.grammar_sampling.waiting        # the step after the grammars' last tokens is in flight
    core.async_scheduling = False
    try:
        after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain, use_tqdm=False)]
    finally:
        core.async_scheduling = True
    assert after == clean
    assert not core.grammar_sampling.waiting and core.get_num_free_blocks() == core.num_blocks


def test_abort_while_a_step_waits_for_its_bitmask(llm):
    engine = llm.llm_engine
    core = engine.core
    for i in range(4):
        engine.add_request(f"abort-{i}", PROMPTS[i], constrained(seed=i, temperature=1.0, json=SCHEMAS[0]))
    finished = {}

    def step() -> None:
        finished.update((out.request_id, out) for out in engine.step() if out.finished)

    for _ in range(3):                         # the prompts, then two tokens of the at least 12 the schema needs
        step()
    assert core.grammar_sampling.waiting       # step N+1: launched, its bitmask filling
    assert not finished
    engine.abort_request(["abort-0", "abort-2"])
    while engine.has_unfinished_requests():
        step()
    assert sorted(finished) == ["abort-1", "abort-3"]
    for out in finished.values():
        jsonschema.validate(json.loads(finished_text(out), strict=False), SCHEMAS[0])
    assert core.get_num_free_blocks() == core.num_blocks
    assert not core.structured_outputs.active


@pytest.mark.parametrize("placement", ["engine-process", "matcher-process", "both"])
@pytest.mark.parametrize("layout", ["GGGG", "GGP", "PGPGG"])   # G: a grammar row, P: a plain row
def test_batched_fill_and_accepts_match_each_rows_own_matcher(llm, layout, placement, monkeypatch):
    """The manager's step (one batched fill: rows 0..k-1 without an index list, other layouts with
    one; plain rows all ones; then one accept per row), with the matchers here, in the matcher process,
    or both (the first grammar rows released before the process served), gives every row the bitmask
    its own matcher fills, step after step, until the grammars end."""
    import xgrammar

    core = llm.llm_engine.core
    tokenizer = llm.get_tokenizer()
    manager = StructuredOutputManager(lambda: tokenizer, core.vocab_size, sorted(core.eos_token_ids))
    manager.use_matcher_process = placement != "engine-process"
    if placement == "both":              # the process does not serve yet: the first rows stay here
        monkeypatch.setattr(MatcherProcess, "ready", property(lambda self: False))
    elif placement == "matcher-process":
        assert manager.start_matcher_process().wait_ready(120)
    plain = SamplingParams(max_tokens=MAX_TOKENS)
    seqs, own = [], []
    for row, kind in enumerate(layout):
        params = constrained(json=SCHEMAS[row]) if kind == "G" else plain
        seq = EngineSequence([1, 2, 3], params.stop_rules(core.eos_token_ids, max_model_len=512, prompt_len=3),
                             request_id=f"{layout}-{row}", index=0, params=params, seed=row, reports_each_token=False)
        seqs.append(seq)
        if kind == "G":
            manager.hold(seq)
            assert params.structured_outputs is not None
            own.append(xgrammar.GrammarMatcher(manager.compiler.submit(params.structured_outputs).result()))
            while manager.num_held:
                manager.release(wait=True)
            if placement == "both" and sum(matcher is not None for matcher in own) == 1:   # the first grammar row
                monkeypatch.undo()           # from the next grammar row on: in the process
                assert manager.start_matcher_process().wait_ready(120)
        else:
            own.append(None)
    placed = sum(seq.request_id in manager._process_grammars for seq in seqs)
    assert placed == {"engine-process": 0, "matcher-process": layout.count("G"),
                      "both": layout.count("G") - 1}[placement]
    width = manager.bitmask_width
    ended = set()
    for _ in range(MAX_TOKENS):
        bitmask = manager.fill_bitmask(seqs)
        assert bitmask is not None and bitmask.shape == (len(layout), width)
        tokens = []
        for row, matcher in enumerate(own):
            expected = np.full((1, width), -1, dtype=np.int32)
            if matcher is not None and row not in ended:
                matcher.fill_next_token_bitmask(expected, 0)
            np.testing.assert_array_equal(bitmask[row], expected[0])
            allowed = np.flatnonzero(np.unpackbits(expected[0].view(np.uint8), bitorder="little"))
            tokens.append(int(allowed[(7 * row + len(ended)) % len(allowed)]))   # some allowed token
        finished = manager.accept(seqs, tokens)
        for row, matcher in enumerate(own):
            if matcher is not None and row not in ended:
                assert matcher.accept_token(tokens[row])
                if matcher.is_terminated():
                    ended.add(row)
        assert {seqs.index(seq) for seq, _ in finished} <= ended
        if len(ended) == layout.count("G"):
            break
    manager.shutdown()
    assert len(ended) == layout.count("G")       # every grammar ended (each is bounded)


def test_the_matcher_process_keeps_a_bounded_set_of_grammars():
    """Beyond MAX_CHILD_GRAMMARS, the least recently added grammars no matcher uses are dropped from the
    child (and sent again when a request needs one)."""
    from nv_engine.structured_output.matcher_process import MAX_CHILD_GRAMMARS

    process = MatcherProcess(max_rows=4, width=8)        # never started: the bookkeeping only
    keys = [("json", str(i)) for i in range(MAX_CHILD_GRAMMARS + 6)]
    for key in keys:
        process.add_grammar(key, "{}")
    assert [process.has_grammar(key) for key in keys] == [False] * 6 + [True] * MAX_CHILD_GRAMMARS
    process.add_grammar(keys[0], "{}")                   # needed again: back, the oldest unused one goes
    assert process.has_grammar(keys[0]) and not process.has_grammar(keys[6])


def test_fill_threads_follow_the_rows_and_the_cores():
    assert [fill_threads_for(rows, 2) for rows in (1, 64, 256, 4096)] == [1, 1, 1, 1]   # 2 cores: one thread
    assert [fill_threads_for(rows, 16) for rows in (1, 64, 128, 129, 256, 4096)] == [1, 1, 1, 2, 2, 8]
    assert [fill_threads_for(1024, cores) for cores in (1, 3, 4, 6, 64)] == [1, 1, 2, 3, 8]
    assert fill_threads_for(0, 16) == 1


def test_manager_bitmask_buffers_pinned_only_when_asked(llm):
    import torch

    core = llm.llm_engine.core
    assert core.structured_outputs.pin_memory is False        # a CPU engine never pins
    tokenizer = llm.get_tokenizer()
    pins = [False, True] if torch.cuda.is_available() else [False]
    for pin in pins:
        manager = StructuredOutputManager(lambda: tokenizer, core.vocab_size, sorted(core.eos_token_ids),
                                          pin_memory=pin)
        params = constrained(json=SCHEMAS[1])
        seq = EngineSequence([1, 2, 3], params.stop_rules(core.eos_token_ids, max_model_len=512, prompt_len=3),
                             request_id=f"pin-{pin}", index=0, params=params, seed=0, reports_each_token=False)
        manager.hold(seq)
        while manager.num_held:
            manager.release(wait=True)
        bitmask = manager.fill_bitmask([seq])
        assert bitmask is not None and bitmask.shape == (1, manager.bitmask_width)
        assert torch.from_numpy(bitmask).is_pinned() is pin
        manager.shutdown()


def test_a_failing_bitmask_fill_aborts_the_step_not_the_engine(llm, monkeypatch):
    def failing(self, seqs):
        future: Future = Future()
        future.set_exception(RuntimeError("bitmask fill failed"))
        return future

    monkeypatch.setattr(StructuredOutputManager, "fill_bitmask_async", failing)
    with pytest.raises(RuntimeError, match="bitmask fill failed"):
        llm.generate(PROMPTS[:2], [constrained(json=SCHEMAS[0]), SamplingParams(max_tokens=8)], use_tqdm=False)
    monkeypatch.undo()
    core = llm.llm_engine.core
    assert not llm.llm_engine.has_unfinished_requests()
    assert core.get_num_free_blocks() == core.num_blocks
    out = llm.generate([PROMPTS[0]], constrained(json=SCHEMAS[1]), use_tqdm=False)[0]
    jsonschema.validate(json.loads(finished_text(out), strict=False), SCHEMAS[1])


# ---- SmolLM2 (real weights) ------------------------------------------------------------------
SMOLLM2_SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["city", "country"],
     "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}}},
    {"type": "object", "additionalProperties": False, "required": ["answer", "confidence"],
     "properties": {"answer": {"enum": ["yes", "no"]},
                    "confidence": {"type": "integer", "minimum": 0, "maximum": 100}}},
]
SMOLLM2_QUESTIONS = ["What is the capital of France? Answer in JSON.", "Is the sky blue? Answer in JSON."]


def test_smollm2_chat_answers_validate(smollm2_dir: Path):
    params = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=StructuredOutputsParams(json=s))
              for s in SMOLLM2_SCHEMAS]
    with LLM(str(smollm2_dir), max_model_len=512, max_num_seqs=4) as smollm2:
        outputs = smollm2.chat([[{"role": "user", "content": q}] for q in SMOLLM2_QUESTIONS], params,
                               use_tqdm=False)
    values = []
    for output, schema in zip(outputs, SMOLLM2_SCHEMAS, strict=True):
        value = json.loads(finished_text(output), strict=False)
        jsonschema.validate(value, schema)
        values.append(value)
    assert "paris" in values[0]["city"].lower()
