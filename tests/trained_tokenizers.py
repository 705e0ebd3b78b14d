"""Byte-level BPE tokenizers trained offline on a small multilingual corpus (the detokenizer tests of
packages/nv-engine use them). The corpus mixes ASCII, accented Latin, CJK and emoji, so a 400-id vocabulary
merges common words while rarer characters stay split into their UTF-8 bytes across tokens."""
from __future__ import annotations

from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CORPUS = ["hello world, this is a test of the tokenizer.", "héllo wörld ça va? naïve café",
          "日本語のテキストです。中文文本。", "emoji 🙂🚀 and more 🙂", "def f(x):\n    return x + 1\n",
          "The quick brown fox jumps over the lazy dog."] * 20
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>"]      # ids 0 and 1
# GPT-4 / Llama-3 style split (Qwen's is the same shape)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+")


def train_byte_level_bpe(style: Literal["gpt2", "qwen"] = "gpt2", vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE tokenizer of vocab_size ids (SPECIAL_TOKENS first) trained on CORPUS. "gpt2": GPT-2 /
    SmolLM2 style, the ByteLevel pre-tokenizer's own split; "qwen": Llama-3 / Qwen style, an NFC normalizer and
    LLAMA3_SPLIT before a ByteLevel pre-tokenizer without its regex."""
    tok = Tokenizer(models.BPE())
    if style == "qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator(CORPUS, trainer)
    return tok
