"""The frontend's CPU cost per output token: incremental detokenization, and the whole
OutputProcessor.process (detokenize + build RequestOutputs) for streamed requests.

N sequences of T tokens are fed one token per sequence per step, as the engine core reports them:
random ids of the tokenizer's vocabulary (what a random-weight model emits: cut and invalid UTF-8 is
common) and real text's ids. Prints CPU microseconds per token (process time: stable on a busy machine)
for each detokenizer path (byte-level table, tokenizers' DecodeStream, the two-window decoder) and for
OutputProcessor.process with CUMULATIVE and DELTA outputs, byte-level path on and off.

    python benchmarks/bench_detokenizer.py [--tokenizer DIR] [--sequences 256] [--tokens 500] [--window]

--tokenizer: a HF tokenizer (a checkpoint directory); default: the default model's (SmolLM2).
"""
from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.engine.byte_level_vocab import ByteLevelVocab
from nv_engine.engine.detokenizer import IncrementalDetokenizer
from nv_engine.engine.output_processor import OutputProcessor
from nv_engine.sampling_params import RequestOutputKind, SamplingParams

PROMPT_TOKENS = 32
DETOKENIZER_PATHS = {"byte-level": {}, "DecodeStream": {"use_byte_level": False},
                     "window": {"use_byte_level": False, "use_decode_stream": False}}


def workloads(tokenizer: PreTrainedTokenizerBase, sequences: int, tokens: int) -> dict[str, list[list[int]]]:
    """name -> per sequence its output ids."""
    rng = random.Random(0)
    vocab = len(tokenizer)
    text_ids: list[int] = []
    for doc in sorted(Path(__file__).resolve().parents[1].glob("*.md")):   # the repo's own prose
        text_ids += tokenizer.encode(doc.read_text(), add_special_tokens=False)
    while len(text_ids) < 2 * tokens:
        text_ids += text_ids or tokenizer.encode("The quick brown fox jumps over the lazy dog. ")
    starts = [rng.randrange(len(text_ids) - tokens) for _ in range(sequences)]
    return {"random ids": [[rng.randrange(vocab) for _ in range(tokens)] for _ in range(sequences)],
            "text ids": [text_ids[s:s + tokens] for s in starts]}


def cpu_us_per_token(run: Callable[[], None], num_tokens: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / num_tokens * 1e6


def bench_detokenizer(tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], outputs: list[list[int]],
                      options: dict) -> float:
    detokenizers = [IncrementalDetokenizer(tokenizer, p, **options) for p in prompts]

    def run() -> None:
        for step in range(len(outputs[0])):
            for detokenizer, ids in zip(detokenizers, outputs, strict=True):
                detokenizer.update(ids[step:step + 1])

    return cpu_us_per_token(run, len(outputs) * len(outputs[0]))


def bench_output_processor(tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
                           outputs: list[list[int]], kind: RequestOutputKind) -> float:
    processor = OutputProcessor(tokenizer, stream_outputs=True)
    tokens = len(outputs[0])
    for i, prompt in enumerate(prompts):
        processor.add_request(f"cmpl-{i}", None, prompt, SamplingParams(max_tokens=tokens, output_kind=kind))
    steps = [[SequenceUpdate(f"cmpl-{i}", 0, ids[step:step + 1], None, 0.0, None, None, 0)
              for i, ids in enumerate(outputs)] for step in range(tokens)]

    def run() -> None:
        for updates in steps:
            processor.process(updates)

    return cpu_us_per_token(run, len(outputs) * tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer directory (default: SmolLM2's)")
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--window", action="store_true", help="also time the (slow) two-window decoder")
    args = parser.parse_args()
    if args.tokenizer is None:
        from nv_engine.model_loader.gguf.default_model import default_model_dir

        args.tokenizer = str(default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    start = time.perf_counter()
    byte_level = ByteLevelVocab.of(tokenizer) is not None
    print(f"tokenizer {args.tokenizer}: {len(tokenizer)} ids, byte-level: {byte_level} "
          f"(table built in {time.perf_counter() - start:.2f} s); {args.sequences} sequences x {args.tokens} tokens")
    rng = random.Random(1)
    prompts = [[rng.randrange(len(tokenizer)) for _ in range(PROMPT_TOKENS)] for _ in range(args.sequences)]
    for name, outputs in workloads(tokenizer, args.sequences, args.tokens).items():
        print(f"-- {name}: CPU us per token")
        for path, options in DETOKENIZER_PATHS.items():
            if path == "window" and not args.window:
                continue
            us = bench_detokenizer(tokenizer, prompts, outputs, options)
            print(f"  IncrementalDetokenizer.update, {path:>12}: {us:6.2f}")
        for use_byte_level in (True, False) if byte_level else (False,):
            # byte-level off: the tokenizer's cache entry says "not byte-level" (DecodeStream is used)
            ByteLevelVocab._cache[tokenizer] = ByteLevelVocab._build(tokenizer) if use_byte_level else None
            for kind in RequestOutputKind:
                us = bench_output_processor(tokenizer, prompts, outputs, kind)
                path = "byte-level" if use_byte_level else "DecodeStream"
                print(f"  OutputProcessor.process, {path:>12}, {kind.name:>10}: {us:6.2f}")


if __name__ == "__main__":
    main()
