"""Warm-up at engine start: StepInputs that make every kernel variant a request can meet compile before
the engine serves (a Triton compile costs ~0.2-2 s, and inside a request it is that request's latency).

Triton compiles a kernel per specialisation of its integer arguments (== 1, divisible by 16, other)
and per constexpr value, so the steps cover, for the dimensions that reach kernels (tokens T,
sequences B, sampling rows S, block-table width M), each class 1 / 16k / other, crossed where one
launch sees them together:
  - prefill of B in {1, 2, 3, 4, 16, 17} sequences of q in {1, 2, 16, 17} tokens with M in
    {1, 2, 16, 17} block-table columns (a cached prefix where the context is longer than q): B and
    T = B * q also set the offsets of the staged inputs, hence the pointers' 16-byte alignment,
    which Triton specialises too; many prompts at once; a long prompt in chunks (a full budget
    chunk that samples nothing, then the rest); mixed steps (decodes plus a prefill chunk);
  - decode at every captured CUDA-graph size, with short and max_model_len contexts;
  - each sampler path (all greedy, temperature, top-k / top-p / min-p, mixed greedy and random) at
    every S whose launch may differ (class and S mod 8; nv_kernels.sampler_kernel picks its chunk
    count from S), and the
    rest (penalties, logprobs, prompt logprobs, seeds, logit bias, allowed ids, min_tokens) at a
    few sizes.
The KV cache is written with garbage: the blocks are free and the scheduler's prefix cache never
sees them (it is built after the warm-up and knows no block yet).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nv_engine.core.sampling_batch import SamplingBatchBuilder, SamplingRow
from nv_engine.core.step import PromptLogprobsBatch, StepInput
from nv_engine.runner.cuda_graphs import graph_batch_sizes
from nv_engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nv_engine.config.engine_config import EngineConfig
    from nv_engine.executor import Executor

logger = logging.getLogger(__name__)

# one per kernel path of the sampler's draw (nv_layers.sampler): argmax, scaled noise, filtered logits
_GREEDY = SamplingParams(temperature=0.0)
_RANDOM = SamplingParams(temperature=0.8)
_FILTERED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)
_DRAW_PATHS: tuple[tuple[SamplingParams, ...], ...] = ((_GREEDY,), (_RANDOM,), (_FILTERED,), (_GREEDY, _RANDOM))


@dataclass(frozen=True)
class _Seq:
    """One sequence of a warm-up step: context start (a cached prefix), tokens computed now, samples."""

    start: int
    num_tokens: int
    samples: bool = True

    @property
    def seq_len(self) -> int:
        return self.start + self.num_tokens


class WarmupSteps:
    """The warm-up StepInputs for an engine's shape (`steps()`), and `run(executor)` to execute them."""

    def __init__(self, *, block_size: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 num_blocks: int, vocab_size: int, max_logprobs: int = 20,
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        if min(block_size, max_num_seqs, max_num_batched_tokens, max_model_len, num_blocks, vocab_size) < 1:
            raise ValueError("WarmupSteps needs positive sizes")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self.max_graph_batch = min(max_num_seqs, max_num_batched_tokens)   # as ModelRunner.capture_cudagraphs
        self.sampling_builder = SamplingBatchBuilder(vocab_size, eos_token_ids)

    @classmethod
    def for_engine(cls, config: EngineConfig, num_blocks: int, eos_token_ids: tuple[int, ...] = ()) -> WarmupSteps:
        return cls(block_size=config.block_size, max_num_seqs=config.max_num_seqs,
                   max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
                   num_blocks=num_blocks, vocab_size=int(config.hf_config.vocab_size),
                   max_logprobs=config.max_logprobs, eos_token_ids=eos_token_ids)

    def run(self, executor: Executor) -> int:
        """Execute every warm-up step (all ranks); the number of steps."""
        start = time.perf_counter()
        count = 0
        for step in self.steps():
            if executor.execute(step) is None and executor.is_driver:
                raise RuntimeError("the executor returned no result for a warm-up step")
            count += 1
        logger.info("warm-up: %d steps in %.2f s", count, time.perf_counter() - start)
        return count

    # ---- the steps ---------------------------------------------------------------------------
    def steps(self) -> Iterator[StepInput]:
        yield from self._prefill_steps()
        yield from self._decode_steps()
        yield from self._sampler_steps()

    def _prefill_steps(self) -> Iterator[StepInput]:
        bs, budget, max_len = self.block_size, self.budget, self.max_model_len
        # B sequences of q tokens each, with M block-table columns (a cached prefix where the context is
        # longer than q); B and T = B * q also move the staged inputs' offsets, so pointer alignment
        for num_seqs in (1, 2, 3, 4, 16, 17):
            for num_tokens in (1, 2, 16, 17):
                for width in (1, 2, 16, 17):
                    seq_len = max(num_tokens, (width - 1) * bs + 1)
                    if (num_seqs <= self.max_num_seqs and num_seqs * num_tokens <= budget and seq_len <= max_len
                            and _ceil_div(seq_len, bs) == width):
                        yield self.step([_Seq(seq_len - num_tokens, num_tokens)] * num_seqs)
        for num_seqs in (5, self.max_num_seqs):   # many prompts in one step
            per_seq = min(3, budget // num_seqs)
            if 2 <= num_seqs <= self.max_num_seqs and per_seq >= 1:
                yield self.step([_Seq(0, per_seq)] * num_seqs)
        chunk = min(budget, max_len)              # a long prompt: full chunks (no sample), then the rest
        yield self.step([_Seq(0, chunk, samples=max_len <= budget)])
        if max_len > budget:
            yield self.step([_Seq(budget, min(budget, max_len - budget))])
            many = max(1, budget // max(1, max_len // 2))
            yield self.step([_Seq(0, budget // many, samples=False)] * min(many, self.max_num_seqs))
        for num_decodes in (1, 15, 16):           # mixed: decodes and one prefill chunk
            if num_decodes + 1 <= self.max_num_seqs and num_decodes + 17 <= budget:
                yield self.step([_Seq(self._context(bs + 3), 1)] * num_decodes + [_Seq(0, 17)])
        width = min(self.max_logprobs, 5)         # prompt logprobs (a prefill and a chunk after a prefix)
        yield self.step([_Seq(0, min(17, budget))], prompt_logprobs=width)
        if max_len >= 2 * bs + 16 and budget >= 16:
            yield self.step([_Seq(2 * bs, 16)], prompt_logprobs=0)

    def _decode_steps(self) -> Iterator[StepInput]:
        for size in graph_batch_sizes(self.max_graph_batch):
            yield self.step([_Seq(self._context(self.block_size + 1 + i % 7), 1) for i in range(size)], decode=True)
        for size in sorted({1, self.max_graph_batch}):
            yield self.step([_Seq(self.max_model_len - 1, 1)] * size, decode=True)

    def sampler_sizes(self) -> list[int]:
        """Sampling-row counts whose sampler launches may differ: one per (class of S, S mod 8: the
        alignment of the sampler inputs packed after S rows, class of the draw kernel's chunk count,
        which nv_kernels' sampler picks from S), over 1..max graph batch."""
        try:
            from nv_kernels.sampler_kernel import default_num_chunks
        except Exception:  # noqa: BLE001 - no triton: the torch sampler has no variants to compile
            default_num_chunks = None
        block = 1024
        seen: dict[tuple[str, int, str], int] = {}
        for rows in range(1, self.max_graph_batch + 1):
            chunks = 0
            if default_num_chunks is not None:
                chunks = default_num_chunks(rows, self.vocab_size, block)
                chunk = _ceil_div(_ceil_div(self.vocab_size, chunks), block) * block   # as sample_tokens
                chunks = _ceil_div(self.vocab_size, chunk)
            seen.setdefault((_int_class(rows), rows % 8, _int_class(chunks)), rows)
        return sorted(seen.values())

    def _sampler_steps(self) -> Iterator[StepInput]:
        decode = _Seq(self._context(self.block_size), 1)
        for rows in self.sampler_sizes():
            for path in _DRAW_PATHS:
                yield self.step([decode] * rows, [path[i % len(path)] for i in range(rows)], decode=True)
        n = min(self.max_logprobs, 5)
        features = [
            SamplingParams(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1),
            SamplingParams(temperature=0.0, repetition_penalty=1.2),
            SamplingParams(temperature=0.0, logprobs=n), SamplingParams(temperature=0.8, logprobs=0),
            SamplingParams(temperature=0.8, top_k=5, logprobs=n), SamplingParams(temperature=0.9, seed=1234),
            SamplingParams(temperature=0.0, logit_bias={1: 2.0, 2: -2.0}),
            SamplingParams(temperature=0.8, allowed_token_ids=[1, 2, 3]),
            SamplingParams(temperature=0.8, min_tokens=4, stop_token_ids=[1]),
        ]
        for rows in sorted({1, min(17, self.max_graph_batch)}):
            for params in features:
                yield self.step([decode] * rows, [params] * rows, decode=True)
            yield self.step([decode] * rows, [features[i % len(features)] for i in range(rows)], decode=True)

    def _context(self, tokens: int) -> int:
        """A decode's context before its token, within max_model_len."""
        return max(0, min(tokens, self.max_model_len - 1))

    # ---- one StepInput -------------------------------------------------------------------------
    def step(self, seqs: list[_Seq], params: list[SamplingParams] | None = None,
             prompt_logprobs: int | None = None, decode: bool = False) -> StepInput:
        """The StepInput of `seqs` (blocks dealt in order, wrapping over the cache), sampling the rows
        that sample with `params` (greedy by default), prompt logprobs of every row when asked;
        decode: a pure decode step (every sequence one token after its context, sampling)."""
        bs = self.block_size
        if any(s.seq_len > self.max_model_len or s.num_tokens < 1 for s in seqs):
            raise ValueError(f"a warm-up sequence outside 1..max_model_len={self.max_model_len}: {seqs}")
        widths = [-(-s.seq_len // bs) for s in seqs]
        num_cols = max(widths)
        first_block = np.cumsum([0, *widths[:-1]])                                       # [B]
        table = (first_block[:, None] + np.arange(num_cols)[None, :]) % self.num_blocks   # [B, M]
        table = np.where(np.arange(num_cols)[None, :] < np.array(widths)[:, None], table, 0).astype(np.int32)
        q_lens = np.array([s.num_tokens for s in seqs], dtype=np.int64)                   # [B]
        starts = np.array([s.start for s in seqs], dtype=np.int64)                        # [B]
        total = int(q_lens.sum())
        seq_starts_in_batch = np.cumsum(q_lens) - q_lens
        positions = np.arange(total, dtype=np.int64) - np.repeat(seq_starts_in_batch - starts, q_lens)   # [T]
        rows = np.repeat(np.arange(len(seqs)), q_lens)                                    # [T]
        slot_mapping = table[rows, positions // bs].astype(np.int64) * bs + positions % bs
        cu_seqlens_q = np.zeros(len(seqs) + 1, dtype=np.int32)
        cu_seqlens_q[1:] = np.cumsum(q_lens)
        samples = np.array([s.samples for s in seqs], dtype=bool)
        logits_indices = (seq_starts_in_batch + q_lens - 1)[samples]                      # [S]
        seq_lens = (starts + q_lens).astype(np.int32)
        input_ids = (np.arange(total, dtype=np.int64) * 7919 + 11) % self.vocab_size
        num_rows = int(samples.sum())
        sampling = None
        if num_rows:
            params = params or [_GREEDY] * num_rows
            context = list(range(1, 9))
            sampling = self.sampling_builder.build(
                [SamplingRow(p, 1000 + i, 2, context, context[:2]) for i, p in enumerate(params[:num_rows])])
        prompt_batch = None
        if prompt_logprobs is not None:
            counts = [s.num_tokens - 1 for s in seqs]
            prompt_batch = PromptLogprobsBatch(
                rows=np.concatenate([np.arange(c) + int(cu_seqlens_q[i]) for i, c in enumerate(counts)]),
                target_ids=np.concatenate([input_ids[int(cu_seqlens_q[i]) + 1:int(cu_seqlens_q[i]) + 1 + c]
                                           for i, c in enumerate(counts)]),
                num_logprobs=prompt_logprobs, seq_ids=list(range(len(seqs))), counts=counts,
                first_positions=[s.start + 1 for s in seqs])
        is_decode = decode and all(s.num_tokens == 1 and s.start > 0 and s.samples for s in seqs)
        return StepInput(
            input_ids=input_ids, positions=positions, slot_mapping=slot_mapping, seq_lens=seq_lens,
            cu_seqlens_q=cu_seqlens_q, block_tables=table, logits_indices=logits_indices, is_decode=is_decode,
            max_seqlen_q=int(q_lens.max()), max_seqlen_k=int(seq_lens.max()), sampling=sampling,
            prompt_logprobs=prompt_batch)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _int_class(value: int) -> str:
    """How Triton specialises an integer argument."""
    return "one" if value == 1 else "div16" if value % 16 == 0 else "other"
