"""BatchTokenizer: the server's prompt texts tokenized in one thread, many per call, with exactly the
ids the tokenizer's own encode gives, and each text's error for that text alone."""
from __future__ import annotations

import asyncio
import random

import pytest

from nv_engine.entrypoints.server.batch_tokenizer import BatchTokenizer
from nv_engine.model_loader.random_model import write_tokenizer

TEXTS = ["Hello, my name is nv.", "  The quick brown fox\njumps over the lazy dog  ", "0 1 2 3 4 5 6 7 8 9 10",
         "Grüße, 東京! def main():\n    print('hi')", "<|im_start|>user\nHi<|im_end|>", ""]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(path, 512)
    return AutoTokenizer.from_pretrained(path)


def encode_all(batch: BatchTokenizer, texts: list[str], add_special_tokens: bool = True) -> list:
    async def run() -> list:
        return await asyncio.gather(*(batch.encode(t, add_special_tokens=add_special_tokens) for t in texts),
                                    return_exceptions=True)
    return asyncio.run(run())


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_ids_equal_the_tokenizers_own_encode(hf_tokenizer, add_special_tokens):
    batch = BatchTokenizer(hf_tokenizer)
    assert batch.backend is not None          # an HF fast tokenizer: the Rust batch path
    rng = random.Random(0)
    texts = TEXTS + [hf_tokenizer.decode([rng.randrange(3, 512) for _ in range(300)]) for _ in range(20)]
    got = encode_all(batch, texts, add_special_tokens)
    assert got == [list(hf_tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]
    batch.close()


def test_a_wave_of_prompts_is_tokenized_in_few_calls(hf_tokenizer):
    """256 prompts arriving together: a handful of batched calls in one thread, not one call (and one
    thread pool thread holding the interpreter lock) per prompt."""
    batch = BatchTokenizer(hf_tokenizer)
    rng = random.Random(1)
    texts = [hf_tokenizer.decode([rng.randrange(3, 512) for _ in range(512)]) for _ in range(256)]
    got = encode_all(batch, texts)
    assert got == [list(hf_tokenizer.encode(t)) for t in texts]
    assert batch.num_batches <= 16, batch.num_batches
    batch.close()


class SlowTokenizer:
    """No Rust backend: encoded one text at a time; "bad" texts raise."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if "bad" in text:
            raise ValueError(f"cannot tokenize {text!r}")
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


class DifferentWrapper(SlowTokenizer):
    """A wrapper whose encode adds what its backend does not: the backend must not be used."""

    def __init__(self, backend) -> None:
        self._tokenizer = backend


def test_without_a_rust_backend_each_text_is_encoded_and_errors_stay_with_their_text():
    batch = BatchTokenizer(SlowTokenizer())
    assert batch.backend is None
    got = encode_all(batch, ["ab", "a bad one", "c"], add_special_tokens=True)
    assert got[0] == [1, 97, 98] and got[2] == [1, 99]
    assert isinstance(got[1], ValueError) and "bad" in str(got[1])
    assert encode_all(batch, ["xy"], add_special_tokens=False) == [[120, 121]]   # still serving
    batch.close()


def test_a_backend_that_disagrees_with_its_wrapper_is_not_used(hf_tokenizer):
    batch = BatchTokenizer(DifferentWrapper(hf_tokenizer._tokenizer))
    assert batch.backend is None
    assert encode_all(batch, ["ab"]) == [[1, 97, 98]]
    batch.close()


def test_an_error_in_the_rust_batch_falls_back_to_one_text_at_a_time(hf_tokenizer):
    batch = BatchTokenizer(hf_tokenizer)
    got = encode_all(batch, ["fine", 12345, "also fine"])       # a non-text in the batch: that one fails
    assert got[0] == list(hf_tokenizer.encode("fine")) and got[2] == list(hf_tokenizer.encode("also fine"))
    assert isinstance(got[1], Exception)
    batch.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(batch.encode("late"))
