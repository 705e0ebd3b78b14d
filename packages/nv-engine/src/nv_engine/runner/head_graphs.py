"""SampledHeadGraphs: the LM head and the draw of a pure-decode step, one CUDA graph per batch size.

The decode graph of size B (runner.cuda_graphs) leaves hidden [B, H] in its static buffer; the head
graph of that size computes the logits [B, V] from it and draws one id per row with the sampler's
fused kernels (greedy where the temperature is 0, else Gumbel-max at that temperature), reading the
temperatures, seeds and sampling positions from the step's staged inputs (InputStager's decode
layout, whose addresses depend only on B). It serves the steps whose rows ask for nothing more
(SamplingBatch.temperature_only, not deferred for a grammar): most steps of plain generation. The
draw is the one the eager sampler makes on the same rows (same kernels, same hash noise).

Why: at batch 1 the host's work per step is about as long as the device's, so the step waits for
the host. One graph launch replaces the eager LM head call, the sampler's launches and the upload
of its per-step tensors.

The graphs share the decode graphs' pool, and the sampled ids live in it: they are read (copied to
the host, gathered into the next step's input ids) before the next replay of any graph of the pool,
which may reuse their memory.

emulate=True (tests on CPU, enforce_eager on CUDA): nothing is captured; a replay runs the head
eagerly on the staged inputs.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# size -> the function that draws that size's ids [size] from the decode graph's hidden states
HeadRun = Callable[[], torch.Tensor]


class SampledHeadGraphs:
    """`capture(head_for_size, pool)` once; then per step, after the decode graph of `padded` rows
    replayed, `replay(padded, batch)` -> the batch's sampled ids [batch] int64."""

    def __init__(self, sizes: list[int], device: torch.device, emulate: bool = False) -> None:
        self.sizes = sorted(sizes)
        self.device = device
        self.emulate = emulate
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.ids: dict[int, torch.Tensor] = {}         # size -> [size] int64, written by that graph's replay
        self.runs: dict[int, HeadRun] = {}              # emulate=True: size -> the eager head

    def capture(self, head_for_size: Callable[[int], HeadRun], pool: Any) -> None:
        """head_for_size(size) stages a dummy decode batch of `size` rows and returns the head over it.
        Largest size first, as the decode graphs (their pool's blocks are reused by the smaller ones);
        each head runs once eagerly first (compiles)."""
        start = time.perf_counter()
        for size in reversed(self.sizes):
            run = head_for_size(size)
            run()
            if self.emulate:
                self.runs[size] = run
                continue
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.ids[size] = run()
            self.graphs[size] = graph
        if not self.emulate:
            torch.cuda.synchronize(self.device)
            logger.info("captured %d LM head + sampler CUDA graphs in %.1f s", len(self.sizes),
                        time.perf_counter() - start)

    def replay(self, padded_size: int, batch_size: int) -> torch.Tensor:
        """Draw from the hidden states the decode graph of `padded_size` left; ids [batch_size]."""
        if self.emulate:
            return self.runs[padded_size]()[:batch_size]
        self.graphs[padded_size].replay()
        return self.ids[padded_size][:batch_size]

    def release(self) -> None:
        self.graphs.clear()
        self.ids.clear()
        self.runs.clear()
