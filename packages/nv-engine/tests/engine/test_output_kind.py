"""SamplingParams.output_kind: DELTA outputs, concatenated, are the CUMULATIVE ones (text, token ids,
logprobs; n > 1, stop strings, prompt logprobs once), and both kinds can share one OutputProcessor."""
from __future__ import annotations

import random
from itertools import zip_longest

import pytest
from transformers import AutoTokenizer

from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.engine.output_processor import OutputProcessor
from nv_engine.engine.outputs import Logprob
from nv_engine.sampling_params import RequestOutputKind, SamplingParams
from nv_kvcache import FinishReason

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _updates(request_id: str, index: int, ids: list[int], finish_at: int | None, with_prompt_logprobs: bool):
    """One update per token (the last one finishing by length at finish_at), with logprobs."""
    for step, token_id in enumerate(ids):
        finish = FinishReason.LENGTH if step == finish_at else None
        sample = [{token_id: Logprob(-0.25 * (step % 4), 1), 3: Logprob(-3.0, 2)}]
        prompt_logprobs = [{p: Logprob(-1.0, 1)} for p in PROMPT[1:]] if step == 0 and with_prompt_logprobs else None
        yield SequenceUpdate(request_id, index, [token_id], sample, -0.25 * (step % 4), finish, None, 0,
                             prompt_logprobs)
        if finish is not None:
            return


def _run(tokenizer, kind: RequestOutputKind, ids: dict[int, list[int]], stop: list[str]):
    processor = OutputProcessor(tokenizer, stream_outputs=True)
    params = SamplingParams(n=2, logprobs=1, prompt_logprobs=0, stop=stop, max_tokens=100, output_kind=kind)
    processor.add_request("r", None, PROMPT, params)
    steps = zip_longest(*(_updates("r", i, ids[i], len(ids[i]) - 1, i == 0) for i in (0, 1)))
    outputs = []
    for step in steps:
        outputs += processor.process([u for u in step if u is not None]).request_outputs
    assert outputs[-1].finished and not processor.has_unfinished_requests()
    return outputs


def _added_up(outputs):
    """The per-completion totals a DELTA consumer builds: text, ids, logprobs; last reasons."""
    totals: dict[int, dict] = {}
    for out in outputs:
        assert out.delta
        for comp in out.outputs:
            t = totals.setdefault(comp.index, {"text": "", "ids": [], "logprobs": []})
            t["text"] += comp.text
            t["ids"] += comp.token_ids
            t["logprobs"] += comp.logprobs
            t["finish"], t["stop"], t["cumlp"] = comp.finish_reason, comp.stop_reason, comp.cumulative_logprob
    return totals


@pytest.mark.parametrize("stop", [[], ["e t"]], ids=["length", "stop_string"])
def test_delta_outputs_add_up_to_the_cumulative_ones(tokenizer, stop):
    rng = random.Random(0)
    words = tokenizer.encode(" one two three four five six seven eight nine ten", add_special_tokens=False)
    ids = {0: words[:12], 1: [rng.randrange(len(tokenizer)) for _ in range(9)]}   # random: cut characters
    cumulative = _run(tokenizer, RequestOutputKind.CUMULATIVE, ids, stop)
    delta = _run(tokenizer, RequestOutputKind.DELTA, ids, stop)
    assert len(cumulative) == len(delta) and not cumulative[0].delta
    for k in range(len(delta)):   # after every output, the deltas so far add up to the cumulative output
        totals = _added_up(delta[:k + 1])
        for comp in cumulative[k].outputs:
            t = totals[comp.index]
            assert (t["text"], t["ids"], t["logprobs"]) == (comp.text, comp.token_ids, comp.logprobs)
            assert (t["finish"], t["stop"], t["cumlp"]) == (comp.finish_reason, comp.stop_reason,
                                                            comp.cumulative_logprob)
    final = cumulative[-1].outputs
    if stop:
        assert final[0].stop_reason == "e t" and final[0].text == " on"   # " one two": cut before "e t"
    assert all(len(out.outputs[1].token_ids) <= 1 for out in delta)   # O(new tokens) per output
    assert delta[0].prompt_logprobs == cumulative[0].prompt_logprobs is not None
    assert all(out.prompt_logprobs is None for out in delta[1:])     # sent once
    assert all(out.prompt_logprobs is not None for out in cumulative)


def test_output_kind_is_validated():
    assert SamplingParams(**{"output_kind": 1}).output_kind is RequestOutputKind.DELTA   # a plain int
    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(**{"output_kind": 7})
