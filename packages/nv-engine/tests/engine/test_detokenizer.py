"""Incremental detokenizer over a real byte-level BPE tokenizer trained offline (tests/trained_tokenizers.py)."""
from __future__ import annotations

import pytest
from trained_tokenizers import train_byte_level_bpe
from transformers import PreTrainedTokenizerFast

from nv_engine.engine.detokenizer import IncrementalDetokenizer, decode_token, find_stop_string


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=train_byte_level_bpe(), eos_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])


# the three decoding paths: byte-level table (the default here), tokenizers' DecodeStream, two windows
DECODERS = {"byte_level": {}, "stream": {"use_byte_level": False},
            "window": {"use_byte_level": False, "use_decode_stream": False}}
STREAM_MODES = pytest.mark.parametrize("mode", list(DECODERS.values()), ids=list(DECODERS))


def run(tokenizer, text, prompt="hello", **kw):
    """Feed `text`'s tokens one by one; return the detokenizer and the text after each step."""
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), **kw)
    steps, stopped = [], False
    for token_id in tokenizer.encode(text):
        stopped = detok.update([token_id])
        steps.append(detok.text)
        if stopped:
            break
    return detok, steps, stopped


@STREAM_MODES
def test_multibyte_characters_are_never_cut(tokenizer, mode):
    text = "naïve 🎉 日本語 ünïcödé ✨ ok 🙂"  # 🎉 / ✨ are not in the corpus: split into bytes
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "test needs a character cut between tokens"
    detok, steps, _ = run(tokenizer, text, **mode)
    for partial in steps:
        assert "\ufffd" not in partial
        assert text.startswith(partial)
    assert detok.text == text
    assert any(a == b for a, b in zip(steps, steps[1:], strict=False)), "some step must have held text back"


@STREAM_MODES
def test_stop_string_across_token_boundaries(tokenizer, mode):
    text = "hello world, this is a test of the tokenizer."
    stop = "rld, th"
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert stop not in pieces and not any(stop in p for p in pieces)  # spans several tokens
    detok, _, stopped = run(tokenizer, text, stop=["zzz", stop], **mode)
    assert stopped and detok.stop_reason == stop
    assert detok.text == "hello wo"
    detok, _, stopped = run(tokenizer, text, stop=[stop], include_stop_str_in_output=True,
                            **mode)
    assert stopped and detok.text == "hello world, th"


@STREAM_MODES
def test_stop_string_with_multibyte_and_earliest_match(tokenizer, mode):
    text = "héllo wörld ça va? naïve café"
    detok, _, stopped = run(tokenizer, text, stop=["café", "ça"], **mode)
    assert stopped and detok.stop_reason == "ça" and detok.text == "héllo wörld "
    detok, _, stopped = run(tokenizer, text, stop=["nope"], **mode)
    assert not stopped and detok.text == text and detok.stop_reason is None


@STREAM_MODES
def test_skip_special_tokens(tokenizer, mode):
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    ids = tokenizer.encode("hello") + [im_start] + tokenizer.encode(" world") + [eos]
    for skip, want in [(True, "hello world"), (False, "hello<|im_start|> world<|endoftext|>")]:
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("The"), skip_special_tokens=skip,
                                       **mode)
        for token_id in ids:
            detok.update([token_id])
        assert detok.text == want


def test_min_tokens_delays_stop_strings(tokenizer):
    text = "hello world, this is a test"
    n_world = len(tokenizer.encode("hello world"))
    detok, _, stopped = run(tokenizer, text, stop=["world"], min_tokens=n_world)
    assert not stopped  # "world" completed within the first min_tokens tokens
    detok, _, stopped = run(tokenizer, text, stop=["world"], min_tokens=n_world - 1)
    assert stopped and detok.text == "hello "


def test_stream_text_holds_back_possible_stop_prefix(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [1], stop=["STOP!"])
    for token_id in tokenizer.encode("hello wor"):
        detok.update([token_id])
    assert detok.stream_text(finished=False) == "hello"
    assert detok.stream_text(finished=True) == "hello wor"
    keep = IncrementalDetokenizer(tokenizer, [1], stop=["STOP!"], include_stop_str_in_output=True)
    keep.update(tokenizer.encode("hello"))
    assert keep.stream_text(finished=False) == "hello"


def test_long_generation_keeps_window_short(tokenizer):
    text = "The quick brown fox jumps over the lazy dog. " * 30
    for mode in DECODERS.values():
        detok, _, _ = run(tokenizer, text, **mode)
        assert detok.text == text
        assert len(detok._ids) < 100


def test_find_stop_string_and_decode_token(tokenizer):
    assert find_stop_string("abcabc", ["bc", "abc"], 3) == ("abc", 3)
    assert find_stop_string("xxab", ["ab"], 3) == ("ab", 2)  # starts in the old text
    assert find_stop_string("ab xx", ["ab"], 3) is None  # already seen before new_from
    tok_id = tokenizer.encode("hello")[0]
    assert decode_token(tokenizer, tok_id) == tokenizer.decode([tok_id])
