"""The byte-level detokenizer path (ByteLevelVocab + Python's UTF-8 decoder) against tokenizers' own
decoding: DecodeStream and the two-window decoder stream the same text step by step, on random ids
(cut and invalid UTF-8, special tokens, ids past the vocabulary) and on real text, and the final text
is tokenizer.decode(output ids). Tokenizers are trained offline in GPT-2 / SmolLM2 style and in
Llama-3 / Qwen style (NFC normalizer, regex split); a Metaspace (SentencePiece-style) one falls back."""
from __future__ import annotations

import random
from typing import Any, Literal

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from trained_tokenizers import CORPUS, train_byte_level_bpe
from transformers import PreTrainedTokenizerFast

from nv_engine.engine.byte_level_vocab import ByteLevelVocab
from nv_engine.engine.detokenizer import IncrementalDetokenizer, decode_token

TEXT = "naïve 🎉 日本語 ünïcödé ✨ ok 🙂 café\n\tdef g(): return 'x'"


def _byte_level(style: Literal["gpt2", "qwen"]) -> PreTrainedTokenizerFast:
    tok = train_byte_level_bpe(style)
    # added tokens: ASCII and non-ASCII, special and not (Qwen's <think> is not special)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("日本", special=False),
                    AddedToken("Ġx", special=False)])
    tok.add_special_tokens([AddedToken("<|ü|>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module", params=["gpt2", "qwen"])
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return _byte_level(request.param)


def _streamed(tokenizer, prompt: list[int], ids: list[int], **kw) -> list[str]:
    """The text after each of `ids`, fed one per step."""
    detok = IncrementalDetokenizer(tokenizer, prompt, **kw)
    texts = []
    for token_id in ids:
        detok.update([token_id])
        texts.append(detok.text)
    return texts


def test_random_ids_stream_as_tokenizers_decoders_do(tokenizer):
    vocab = ByteLevelVocab.of(tokenizer)
    assert vocab is not None and ByteLevelVocab.of(tokenizer) is vocab     # built once
    size = len(tokenizer)
    rng = random.Random(0)
    prompt = tokenizer.encode("hello world")
    cut = 0
    for trial in range(60):
        ids = [rng.randrange(size + 8) for _ in range(rng.randrange(1, 40))]   # some past the vocab
        skip = trial % 2 == 0
        fast = _streamed(tokenizer, prompt, ids, skip_special_tokens=skip)
        assert fast == _streamed(tokenizer, prompt, ids, skip_special_tokens=skip, use_byte_level=False)
        assert fast == _streamed(tokenizer, prompt, ids, skip_special_tokens=skip, use_byte_level=False,
                                 use_decode_stream=False)
        full = tokenizer.decode([i for i in ids if i < size], skip_special_tokens=skip)
        assert full.startswith(fast[-1])
        if not full.endswith("\ufffd"):
            assert fast[-1] == full
        cut += full.endswith("\ufffd")
    assert cut, "some sequence must end in a cut character"


def test_real_text_special_tokens_and_stop_strings(tokenizer):
    ids = tokenizer.encode(TEXT)
    special = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|ü|>", "<think>", "日本", "Ġx")]
    ids = ids[:5] + special + ids[5:]
    prompt = tokenizer.encode("The")
    options: list[dict[str, Any]] = [{"skip_special_tokens": True}, {"skip_special_tokens": False},
                                     {"stop": ["日本語", "✨"]}, {"stop": ["ünï"], "include_stop_str_in_output": True}]
    for kw in options:
        fast = IncrementalDetokenizer(tokenizer, prompt, **kw)
        slow = IncrementalDetokenizer(tokenizer, prompt, use_byte_level=False, **kw)
        for token_id in ids:
            stopped = fast.update([token_id])
            assert stopped == slow.update([token_id])
            assert fast.text == slow.text and fast.stream_text(False) == slow.stream_text(False)
            if stopped:
                assert fast.stop_reason == slow.stop_reason
                break
        if "stop" not in kw:
            assert fast.text == tokenizer.decode(ids, skip_special_tokens=kw["skip_special_tokens"])
    for token_id in {*ids, len(tokenizer) + 3}:
        assert decode_token(tokenizer, token_id) == tokenizer.decode([token_id])


def test_a_character_cut_between_prompt_and_output_belongs_to_the_output(tokenizer):
    e4, b8, ad = (tokenizer.convert_tokens_to_ids(c) for c in ("ä", "¸", "\u0143"))   # bytes of 中
    assert tokenizer.decode([e4, b8, ad]) == "中"
    prompt = tokenizer.encode("hi") + [e4]
    ids = [b8, ad, *tokenizer.encode(" ok")]
    steps = _streamed(tokenizer, prompt, ids)
    assert steps[0] == "" and steps[-1] == "中 ok"
    assert steps == _streamed(tokenizer, prompt, ids, use_byte_level=False)   # as DecodeStream


def test_only_byte_level_decoders_take_the_fast_path():
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    sentencepiece_like = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert ByteLevelVocab.of(sentencepiece_like) is None
    ids = sentencepiece_like.encode("hello world, this is a test")
    assert _streamed(sentencepiece_like, [], ids)[-1] == sentencepiece_like.decode(ids)
