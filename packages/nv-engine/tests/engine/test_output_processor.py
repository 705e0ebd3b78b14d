"""OutputProcessor on its own: it is fed pickled SequenceUpdates (as from another process) and owns
what the user sees: text, stop strings (handed back to finish), stop ids, logprobs, n completions."""
from __future__ import annotations

import pickle

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


def _update(request_id, index, ids, finish=None, stop_token_id=None, logprobs=None, delta=0.0):
    message = SequenceUpdate(request_id, index, list(ids), logprobs, delta, finish, stop_token_id, 0)
    return pickle.loads(pickle.dumps(message))


def test_stream_stops_on_a_string_and_hands_the_sequence_back(tokenizer):
    ids = tokenizer.encode("one two three four five", add_special_tokens=False)
    processor = OutputProcessor(tokenizer, stream_outputs=True)
    params = SamplingParams(stop=["three"], max_tokens=50)
    assert processor.needs_every_token(params)
    processor.add_request("a", "prompt", PROMPT, params)
    texts, to_finish = [], []
    for token_id in ids:
        processed = processor.process([_update("a", 0, [token_id])])
        to_finish += processed.to_finish
        if processed.request_outputs:
            out = processed.request_outputs[0]
            texts.append(out.outputs[0].text)
            if out.finished:
                break
    assert to_finish == [("a", 0)]
    assert out.finished and out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == "three"
    assert out.outputs[0].text == "one two " and out.prompt == "prompt" and out.prompt_token_ids == PROMPT
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
    assert not processor.has_unfinished_requests()
    assert processor.process([_update("a", 0, [ids[-1]])]).request_outputs == []   # late token: dropped


def test_final_update_decodes_once_and_waits_for_all_n(tokenizer):
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    processor = OutputProcessor(tokenizer, stream_outputs=False)
    params = SamplingParams(n=2, max_tokens=len(ids))
    assert not processor.needs_every_token(params)
    processor.add_request("b", None, PROMPT, params)
    first = processor.process([_update("b", 1, ids, FinishReason.LENGTH)])
    assert first.request_outputs == [] and processor.get_num_unfinished_requests() == 1
    done = processor.process([_update("b", 0, ids[:1], FinishReason.STOP, stop_token_id=ids[0])])
    out = done.request_outputs[0]
    assert out.finished and [c.index for c in out.outputs] == [0, 1]
    assert out.outputs[1].text == "hello there" and out.outputs[1].finish_reason == "length"
    assert out.outputs[0].token_ids == ids[:1] and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason is None          # an EOS id, not one of the request's stop ids


def test_stop_token_id_logprobs_and_abort(tokenizer):
    processor = OutputProcessor(tokenizer, stream_outputs=False)
    processor.add_request("c", None, PROMPT, SamplingParams(stop_token_ids=[9], logprobs=1))
    processor.add_request("d", None, PROMPT, SamplingParams())
    sample = {9: Logprob(-0.5, 1)}
    processed = processor.process([_update("c", 0, [9], FinishReason.STOP, 9, [sample], -0.5),
                                   _update("d", 0, [4])])
    out = processed.request_outputs[0]
    assert [o.request_id for o in processed.request_outputs] == ["c"]
    assert out.outputs[0].stop_reason == 9 and out.outputs[0].cumulative_logprob == -0.5
    assert out.outputs[0].logprobs[0][9].decoded_token == tokenizer.decode([9])
    processor.abort_requests(["d", "unknown"])
    assert not processor.has_unfinished_requests()
    assert processor.process([_update("d", 0, [4], FinishReason.LENGTH)]).request_outputs == []
    with pytest.raises(ValueError, match="in use"):
        processor.add_request("e", None, PROMPT, SamplingParams())
        processor.add_request("e", None, PROMPT, SamplingParams())


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_stream_interval_sends_every_nth_token_and_loses_nothing(tokenizer, kind):
    """stream_interval 4: the first token at once, then one output per 4 tokens, and the end at once; the
    outputs together carry exactly the text and token ids of sending every token."""
    ids = tokenizer.encode("one two three four five six seven eight nine ten", add_special_tokens=False)[:10]
    every, sparse = (OutputProcessor(tokenizer, stream_outputs=True, stream_interval=n) for n in (1, 4))
    params = SamplingParams(max_tokens=len(ids), output_kind=kind)
    for processor in (every, sparse):
        processor.add_request("s", None, PROMPT, params)
    sent_at, texts, token_ids = [], [], []
    for step, token_id in enumerate(ids, start=1):
        finish = FinishReason.LENGTH if step == len(ids) else None
        assert len(every.process([_update("s", 0, [token_id], finish)]).request_outputs) == 1
        outputs = sparse.process([_update("s", 0, [token_id], finish)]).request_outputs
        if outputs:
            sent_at.append(step)
            texts.append(outputs[0].outputs[0].text)
            token_ids.append(outputs[0].outputs[0].token_ids)
    assert sent_at == [1, 5, 9, 10] and outputs[0].finished
    full_text = tokenizer.decode(ids)
    if kind is RequestOutputKind.DELTA:
        assert "".join(texts) == full_text and sum(token_ids, []) == ids
    else:
        assert texts[-1] == full_text and token_ids[-1] == ids


def test_stream_interval_counts_per_completion_and_sends_a_completion_end_at_once(tokenizer):
    processor = OutputProcessor(tokenizer, stream_outputs=True, stream_interval=3)
    processor.add_request("n", None, PROMPT, SamplingParams(n=2, max_tokens=10))
    sent = []
    for step in range(1, 6):
        updates = [_update("n", 0, [11], FinishReason.LENGTH if step == 4 else None)] if step <= 4 else []
        updates.append(_update("n", 1, [12]))
        if processor.process(updates).request_outputs:
            sent.append(step)
    # step 1: the first output; step 4: completion 0 ended (and 2 x 3 tokens were due anyway at step 4)
    assert sent == [1, 4]
    with pytest.raises(ValueError, match="stream_interval"):
        OutputProcessor(tokenizer, stream_outputs=True, stream_interval=0)
