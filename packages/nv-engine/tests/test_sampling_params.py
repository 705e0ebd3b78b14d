"""SamplingParams: defaults, normalisation, validation messages, StopRules."""
from __future__ import annotations

import dataclasses

import pytest

from nv_engine.sampling_params import RequestOutputKind, SamplingParams, SamplingType
from nv_kvcache import StopRules


def test_defaults_are_vllms():
    p = SamplingParams()
    want = dict(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[],
                stop_token_ids=[], ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None,
                presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                skip_special_tokens=True, include_stop_str_in_output=False, logit_bias=None,
                allowed_token_ids=None, bad_words=None, bad_words_token_ids=[], prompt_logprobs=None,
                structured_outputs=None, output_kind=RequestOutputKind.CUMULATIVE)
    assert {f.name: getattr(p, f.name) for f in dataclasses.fields(p)} == want
    assert p.sampling_type == SamplingType.RANDOM and not p.has_penalties


def test_normalisation_and_derived_views():
    p = SamplingParams(stop="###", stop_token_ids=(7, 8), temperature=0, top_k=-1, seed=3)
    assert p.stop == ["###"] and p.stop_token_ids == [7, 8]
    assert p.is_greedy and p.sampling_type == SamplingType.GREEDY and p.effective_top_k == 0
    assert isinstance(p.temperature, float)
    assert SamplingParams(seed=1).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(repetition_penalty=1.2).has_penalties
    assert SamplingParams(max_tokens=None, logprobs=0, top_k=5, n=3).max_tokens is None
    assert SamplingParams(repetition_penalty=3.0, top_k=2**40).repetition_penalty == 3.0
    stops = ["a", "b"]
    q = SamplingParams(stop=stops)
    q.clone().stop.append("c")
    assert q.stop == ["a", "b"] and stops == ["a", "b"]


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("n", 1.5), ("temperature", -0.1), ("temperature", float("nan")),
    ("temperature", "hot"), ("top_p", 0.0), ("top_p", 1.01), ("top_k", -2), ("top_k", 2.0),
    ("min_p", -0.1), ("min_p", 1.5), ("max_tokens", 0), ("max_tokens", 3.0), ("min_tokens", -1),
    ("presence_penalty", 2.5), ("frequency_penalty", -2.5), ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0), ("top_p", float("inf")), ("min_p", float("nan")),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", True),
    ("seed", "x"), ("stop", 5), ("stop", ["ok", ""]), ("stop", ["ok", 3]),
    ("stop_token_ids", [1, "2"]), ("stop_token_ids", [-1]), ("stop_token_ids", 5),
    ("logit_bias", [1, 2]), ("logit_bias", {1: 100.5}), ("logit_bias", {"1": 5}), ("logit_bias", {-1: 5}),
    ("logit_bias", {1: "x"}), ("allowed_token_ids", []), ("allowed_token_ids", [1, -2]),
    ("allowed_token_ids", "12"), ("bad_words", "word"), ("bad_words", ["ok", ""]), ("bad_words", [3]),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    SamplingParams(max_tokens=None, min_tokens=50)  # no bound to break


def test_stop_rules():
    p = SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[5], ignore_eos=True)
    rules = p.stop_rules([1, 2])
    assert rules == StopRules(max_tokens=10, min_tokens=2, ignore_eos=True,
                              eos_token_ids=frozenset({1, 2}), stop_token_ids=frozenset({5}))
    open_ended = SamplingParams(max_tokens=None, min_tokens=3)
    assert open_ended.stop_rules([9], max_model_len=100, prompt_len=30).max_tokens == 70
    with pytest.raises(ValueError, match="max_model_len"):
        open_ended.stop_rules([9])


class _CharTokenizer:
    """One token per character: its code point."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def test_prepare_for_model_checks_ids_and_tokenizes_bad_words():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1000: 1}).prepare_for_model(1000, None)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[0, 999, 1000]).prepare_for_model(1000, None)
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=["ab"]).prepare_for_model(1000, None)
    p = SamplingParams(bad_words=["ab", " c"], logit_bias={5: -100})
    p.prepare_for_model(1000, _CharTokenizer())
    # each word alone, and after a space when that is a distinct sequence of the same length
    assert p.bad_words_token_ids == [[97, 98], [99]]
    assert p.needs_output_token_ids and not SamplingParams(logit_bias={1: 1}).needs_output_token_ids
    assert p.banned_by_bad_words([]) == [99]                 # one-token words: always
    assert p.banned_by_bad_words([1, 97]) == [98, 99]        # "a" ends the output: "b" is banned
    assert p.banned_by_bad_words([97, 1]) == [99]
