"""CUDA graphs for pure-decode steps: one graph per captured batch size, sharing one memory pool.

Each graph runs the model body on static inputs (views into the runner's staging device buffers,
whose decode layout depends only on the padded batch size) and copies the final hidden states into
one static buffer. The LM head and the sampler run eagerly after the replay (one GEMM, plus
sampler kernels that vary with the requests' settings).
Batch sizes are captured largest first so smaller graphs reuse the pool's blocks (idea from
nano-vllm / vLLM); a batch is padded to the next captured size (padding: slot -1, length 0).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nv_layers.forward_context import ForwardContext, forward_context

logger = logging.getLogger(__name__)

# emulate=True keeps, per size, the captured context and the model body instead of a CUDA graph
EmulatedGraph = tuple[ForwardContext, Callable[[int], torch.Tensor]]


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 16 up to 256, every 32 beyond, and the max itself."""
    sizes = [1, 2, 4, 8, *range(16, 65, 8), *range(80, 257, 16), *range(288, max_batch_size + 1, 32)]
    sizes = sorted({s for s in sizes if s < max_batch_size} | {max_batch_size})
    return sizes


class DecodeGraphs:
    """Captured decode graphs. For each size, `prepare(bs)` stages a dummy bs-row decode batch and
    returns its ForwardContext; `run_model(bs)` runs the model body on those staged inputs and returns
    hidden [bs, H]. A replay reuses the staged addresses, so the caller stages the real batch first.

    emulate=True (tests on CPU): nothing is captured; a replay re-runs the model eagerly on the
    captured context, so the static-address discipline (staging layout, padding rows) is exercised
    without a GPU."""

    def __init__(self, max_batch_size: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, emulate: bool = False, rows_per_seq: int = 1, pool: Any = None) -> None:
        # rows_per_seq > 1: verify steps of speculative decoding (runner.verify_graphs), that many query rows
        # per sequence; pool: a graph pool to share (the decode graphs')
        self.sizes = graph_batch_sizes(max_batch_size)
        # padded[b] = smallest captured size >= b, for b in 0..max_batch_size
        self.padded = np.searchsorted(np.array(self.sizes), np.arange(max_batch_size + 1))
        self.padded = np.array(self.sizes)[np.minimum(self.padded, len(self.sizes) - 1)]
        self.max_batch_size = max_batch_size
        self.rows = rows_per_seq
        self.hidden = torch.zeros(max_batch_size * rows_per_seq, hidden_size, dtype=dtype, device=device)  # [maxB*R, H]
        self.graphs: dict[int, torch.cuda.CUDAGraph | EmulatedGraph] = {}
        self.pool = pool
        self.device = device
        self.emulate = emulate
        self.memory_bytes = 0

    def padded_size(self, batch_size: int) -> int | None:
        """The captured size that runs a batch of `batch_size`, or None (run eagerly)."""
        if batch_size > self.max_batch_size or not self.graphs:
            return None
        return int(self.padded[batch_size])

    def capture(self, prepare: Callable[[int], ForwardContext], run_model: Callable[[int], torch.Tensor]) -> None:
        """Largest size first: stage dummy inputs, run once eagerly (warm-up: JIT compiles,
        autotunes), then capture into the shared pool."""
        start = time.perf_counter()
        before = 0 if self.emulate else torch.cuda.mem_get_info(self.device)[0]
        for bs in reversed(self.sizes):
            ctx = prepare(bs)
            with forward_context(ctx):
                self.hidden[:bs * self.rows] = run_model(bs)
                if self.emulate:
                    self.graphs[bs] = (ctx, run_model)
                    continue
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.hidden[:bs * self.rows] = run_model(bs)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
        if self.emulate:
            return
        torch.cuda.synchronize(self.device)
        self.memory_bytes = before - torch.cuda.mem_get_info(self.device)[0]
        logger.info("captured %d %s CUDA graphs (batch sizes %d..%d) in %.1f s, %.0f MiB", len(self.sizes),
                    "decode" if self.rows == 1 else f"verify ({self.rows} rows a sequence)", self.sizes[0],
                    self.sizes[-1], time.perf_counter() - start,
                    self.memory_bytes / (1 << 20))

    def replay(self, padded_size: int, batch_size: int) -> torch.Tensor:
        """Run the graph of `padded_size` on the staged inputs; hidden states [batch_size * rows_per_seq, H]."""
        graph = self.graphs[padded_size]
        if isinstance(graph, tuple):       # emulate=True
            ctx, run_model = graph
            with forward_context(ctx):
                self.hidden[:padded_size * self.rows] = run_model(padded_size)
        else:
            graph.replay()
        return self.hidden[:batch_size * self.rows]

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None
