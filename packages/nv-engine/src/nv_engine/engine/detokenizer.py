"""Incremental detokenization of one sequence, with stop strings.

With a byte-level BPE tokenizer (ByteLevelVocab), each token's bytes are decoded by Python's UTF-8
decoder as they arrive: the text is tokenizer.decode(output ids), except that a character the prompt's
last token starts and the output completes is part of the output (as with DecodeStream).
With another fast HF tokenizer, tokenizers' DecodeStream yields each step's new text (as vLLM v1 does).
Otherwise two short windows of ids are decoded each step (prefix / read offsets, the scheme of
vLLM's detokenize_incrementally and HF's TextStreamer): the delta is decode(ids[prefix:]) minus
decode(ids[prefix:read]). Text ending in U+FFFD (a multi-byte character cut between tokens) is held
back until the next token completes it, so no cut character is ever emitted (each path holds back
text ending in U+FFFD, which also covers a byte no later token can complete).
Each stop string is searched in the new text plus (its length - 1) characters before it.
"""
from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from nv_engine.engine.byte_level_vocab import ByteLevelVocab

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.decoders import DecodeStream
    from transformers import PreTrainedTokenizerBase

# Prompt tokens kept as decoding context, as vLLM does (INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"
_utf8_decode = codecs.utf_8_decode   # (bytes, errors, final) -> (text, bytes used); keeps a cut tail


class IncrementalDetokenizer:
    """Detokenizes one sequence's output tokens as they arrive and applies its stop strings.

    update(new_token_ids) -> True when a stop string matched: `text` is then truncated (the stop
    string kept only with include_stop_str_in_output) and `stop_reason` is the matched string.
    Stop strings are only looked for once more than `min_tokens` output tokens exist (vLLM v1).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: Sequence[int], *,
                 skip_special_tokens: bool = True, stop: Iterable[str] = (),
                 include_stop_str_in_output: bool = False, min_tokens: int = 0,
                 use_byte_level: bool = True, use_decode_stream: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        # Hold back this many trailing characters from streamed text (a stop string may be forming).
        self.stop_buffer_length = 0 if include_stop_str_in_output else max(self.max_stop_len - 1, 0)
        context = [int(t) for t in prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]]
        self._ids: list[int] = context  # decoding window: prompt tail + output ids
        self._prefix_offset = 0
        self._read_offset = len(context)
        vocab = ByteLevelVocab.of(tokenizer) if use_byte_level else None
        # byte-level path: id -> bytes, the undecoded bytes of a cut character, and text decoded but
        # held back because it ends in U+FFFD
        self._token_bytes = vocab.token_bytes(skip_special_tokens) if vocab is not None else None
        self._utf8_tail = b""
        self._held_text = ""
        if self._token_bytes is not None:
            # A character the prompt's last bytes start and the output completes belongs to the output.
            self._byte_level_delta(self._token_bytes, context)
            self._held_text = ""
        self._stream, self._backend = (
            _make_decode_stream(tokenizer, skip_special_tokens, context)
            if use_decode_stream and vocab is None else (None, None))
        self.num_output_tokens = 0
        self.text = ""
        self.stop_reason: str | None = None

    def _decode(self, ids: list[int]) -> str:
        # one list of ids decodes to one str (the stubs also allow a batch's list[str])
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                               clean_up_tokenization_spaces=False))

    def _next_delta(self) -> str:
        """Text completed by the last id in self._ids ("" while a character is still cut)."""
        if self._stream is not None and self._backend is not None:   # both set or both None
            try:
                return self._stream.step(self._backend, self._ids[-1]) or ""
            except Exception:  # noqa: BLE001 - tokenizers raises on a prefix it cannot decode
                # Continue with the window decoder from here, on the last few ids as context.
                self._stream = None
                del self._ids[:-PROMPT_CONTEXT_TOKENS - 1]
                self._prefix_offset, self._read_offset = 0, len(self._ids) - 1
        ids = self._ids
        prefix_text = self._decode(ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""  # nothing printable yet (cut character, or a skipped special token)
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        return new_text[len(prefix_text):]

    def _byte_level_delta(self, table: list[bytes], token_ids: Sequence[int]) -> str:
        """Text these ids complete (byte-level path): all decoded text is held back while the
        bytes end in a cut character or the text in U+FFFD, as the window decoder does."""
        size = len(table)
        tail, held, emitted = self._utf8_tail, self._held_text, ""
        for token_id in token_ids:
            data = tail + table[token_id] if 0 <= token_id < size else tail   # ids past the vocab: no text
            text, used = _utf8_decode(data, "replace", False)
            tail = data[used:]
            held += text
            if held and not tail and held[-1] != _REPLACEMENT_CHAR:
                emitted += held
                held = ""
        self._utf8_tail, self._held_text = tail, held
        return emitted

    def _trim(self) -> None:
        """Drop ids before the decoding window so the list stays short on long generations."""
        drop = self._prefix_offset if self._stream is None else len(self._ids) - PROMPT_CONTEXT_TOKENS
        if drop > 64:
            del self._ids[:drop]
            self._prefix_offset = max(0, self._prefix_offset - drop)
            self._read_offset = max(0, self._read_offset - drop)

    def update(self, new_token_ids: Sequence[int]) -> bool:
        """Add sampled tokens; return True when the sequence must stop on a stop string."""
        if self.stop_reason is not None:
            raise RuntimeError("update() after a stop string already ended this sequence")
        old_len = len(self.text)
        table = self._token_bytes
        if table is not None:
            self.num_output_tokens += len(new_token_ids)
            delta = self._byte_level_delta(table, new_token_ids)
        else:
            delta = ""
            for token_id in new_token_ids:
                self._ids.append(int(token_id))
                self.num_output_tokens += 1
                delta += self._next_delta()
            self._trim()
        if delta:
            # Appended in place when nothing else holds the text (delta outputs): amortised O(delta).
            text, self.text = self.text, ""
            text += delta
            self.text = text
        if not self.stop or self.num_output_tokens <= self.min_tokens or len(self.text) == old_len:
            return False
        match = find_stop_string(self.text, self.stop, old_len)
        if match is None:
            return False
        stop_str, index = match
        end = index + len(stop_str) if self.include_stop_str_in_output else index
        self.text = self.text[:end]
        self.stop_reason = stop_str
        return True

    def stream_text(self, finished: bool, start: int = 0) -> str:
        """Text safe to stream now, from character `start` on: while running, the last (longest
        stop - 1) characters are held back, since they may become the start of a stop string that is
        cut from the output."""
        if finished or self.stop_buffer_length == 0:
            return self.text[start:] if start else self.text
        return self.text[start:max(start, len(self.text) - self.stop_buffer_length)]


def _make_decode_stream(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool, context: list[int]
                        ) -> tuple[DecodeStream, RustTokenizer] | tuple[None, None]:
    """A primed tokenizers.decoders.DecodeStream (Rust, ~10x faster than two decodes per token)
    for a fast HF tokenizer, or (None, None) when unavailable (slow tokenizer, old tokenizers)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None, None
    if not isinstance(backend, Tokenizer):
        return None, None
    stream = DecodeStream(skip_special_tokens=skip_special_tokens)
    try:
        for token_id in context:
            stream.step(backend, token_id)
    except Exception:  # noqa: BLE001 - an odd prompt tail: use the window decoder instead
        return None, None
    return stream, backend


def find_stop_string(text: str, stop: Sequence[str], new_from: int) -> tuple[str, int] | None:
    """The stop string that ends in text[new_from:] (the new text) and starts earliest (longest
    first on a tie), with its index; each string is searched from new_from - len(stop) + 1."""
    best: tuple[str, int] | None = None
    for stop_str in stop:
        index = text.find(stop_str, max(0, new_from - len(stop_str) + 1))
        if index < 0:
            continue
        if best is None or index < best[1] or (index == best[1] and len(stop_str) > len(best[0])):
            best = (stop_str, index)
    return best


def decode_token(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """One token's text, for Logprob.decoded_token (may be partial UTF-8, shown as U+FFFD)."""
    vocab = ByteLevelVocab.of(tokenizer)
    if vocab is not None:
        return vocab.decode_token(int(token_id))
    return cast(str, tokenizer.decode([int(token_id)], skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False))
