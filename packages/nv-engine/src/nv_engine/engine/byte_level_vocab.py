"""ByteLevelVocab: the bytes of every token of a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM).

Such a tokenizer's decoder (tokenizers' ByteLevel) maps each character of a token's string back to
one byte (GPT-2's printable stand-ins for the 256 byte values) and decodes the concatenated bytes as
UTF-8 with U+FFFD for invalid sequences. So a sequence's text is the UTF-8 decoding of its tokens'
bytes in order, which Python's UTF-8 decoder does incrementally at a fraction of a tokenizer call's
cost. A token with a character outside that alphabet (an added token such as "日本") stands for its
own UTF-8 bytes, as in the Rust decoder.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A character outside the byte alphabet: translating to it makes latin-1 encoding fail on purpose.
_NOT_A_BYTE = "\uffff"
# Vocabulary ids decoded one by one against the tokenizer when a vocab is built (besides added tokens).
_CHECKED_IDS = 512


def _byte_of_char() -> dict[int, str]:
    """Code point of each stand-in character -> the byte it stands for (as a latin-1 character):
    printable latin-1 characters stand for themselves, the other bytes for 256 + n in order
    (GPT-2's byte-to-unicode table); the other code points below 256 are marked as no byte."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table = {code: chr(code) for code in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            table[256 + shifted] = chr(byte)
            table[byte] = _NOT_A_BYTE
            shifted += 1
    return table


class ByteLevelVocab:
    """Per token id its bytes, for the tokenizer's decoding with special tokens kept or skipped.

    `ByteLevelVocab.of(tokenizer)` is built once per tokenizer (about 0.2 s for 150k tokens) and is
    None unless the tokenizer is a fast one whose decoder is exactly ByteLevel, and decoding its added
    tokens and a sample of its vocabulary one by one agrees with the tokenizer."""

    _cache: ClassVar[weakref.WeakKeyDictionary[object, ByteLevelVocab | None]] = weakref.WeakKeyDictionary()

    def __init__(self, token_bytes: list[bytes], special_ids: frozenset[int]) -> None:
        self.with_special = token_bytes          # id -> bytes; ids the tokenizer lacks: b""
        self.skip_special = list(token_bytes)    # the same with special tokens as b""
        for token_id in special_ids:
            self.skip_special[token_id] = b""

    def token_bytes(self, skip_special_tokens: bool) -> list[bytes]:
        return self.skip_special if skip_special_tokens else self.with_special

    def decode_token(self, token_id: int) -> str:
        """One token's text with special tokens kept (a cut character shows as U+FFFD), as
        tokenizer.decode([token_id]); "" for an id outside the tokenizer."""
        table = self.with_special
        return table[token_id].decode("utf-8", "replace") if 0 <= token_id < len(table) else ""

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> ByteLevelVocab | None:
        try:
            return cls._cache[tokenizer]
        except KeyError:
            pass
        except TypeError:              # not weakly referenceable: build without caching
            return cls._build(tokenizer)
        vocab = cls._build(tokenizer)
        cls._cache[tokenizer] = vocab
        return vocab

    @classmethod
    def _build(cls, tokenizer: PreTrainedTokenizerBase) -> ByteLevelVocab | None:
        try:
            from tokenizers import Tokenizer, decoders
        except ImportError:
            return None
        backend = getattr(tokenizer, "_tokenizer", None)
        if not isinstance(backend, Tokenizer) or type(backend.decoder) is not decoders.ByteLevel:
            return None
        byte_of_char = _byte_of_char()
        token_strings = backend.get_vocab(with_added_tokens=True)     # token -> id
        size = max(token_strings.values(), default=-1) + 1
        table = [b""] * size
        for token, token_id in token_strings.items():
            try:
                table[token_id] = token.translate(byte_of_char).encode("latin-1")
            except UnicodeEncodeError:    # not all stand-ins: the token is its own UTF-8 text
                table[token_id] = token.encode("utf-8")
        added = backend.get_added_tokens_decoder()
        vocab = cls(table, frozenset(i for i, token in added.items() if token.special))
        checked = sorted({*added, *range(0, size, max(1, size // _CHECKED_IDS))})
        for token_id in checked:
            if vocab.decode_token(token_id) != backend.decode([token_id], skip_special_tokens=False):
                return None
        return vocab
