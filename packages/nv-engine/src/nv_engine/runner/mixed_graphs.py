"""CUDA graphs for the steps that are not pure decode (prefill chunks, and decode rows mixed with them):
the model body cut at every attention, as vLLM's piecewise graphs cut it.

An eager step launches ~10 kernels per layer from Python; on the H200 a Qwen3-0.6B-shaped step with 64
decode rows and one new prompt took ~14 ms of host time for ~2-3 ms of GPU work. A server adds a prompt
to the running batch every few steps, so those steps set its pace. Here, for each padded token count,
the layers' work between two attentions is one graph: norms, projections, MLP, and the q/k-norm + rotary
+ KV-store kernel (it only needs the static positions and slot mapping). Attention itself runs eagerly
between the pieces, on the step's real metadata (sequence lengths, block tables, query offsets), which
no fixed graph could hold. A replay of a T-token step is then len(layers) + 1 graph launches and one
attention launch (plus one copy) per layer.

Static buffers: each piece before an attention copies q into `q` [T, Hq * D]; the attention writes its
output into `out` [T, Hq * D], which the next piece reads. Layers run one after another, so every layer
and every size shares those two buffers. Padding rows (id 0, position 0, slot -1) are computed and
ignored: the attention reads only the step's real rows.
Sizes are captured largest first into a pool shared with the decode graphs; a pool may be shared because
no two graphs replay interleaved (the eager attention in between allocates outside the pool).

emulate=True (tests on CPU): nothing is captured; a replay runs the model on the static inputs with the
split in place (the q copy, the eager attention on the real rows, the shared output buffer).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nv_engine.runner.piece_recorder import PieceRecorder
from nv_layers.attention import Attention
from nv_layers.forward_context import ForwardContext, forward_context, get_forward_context

logger = logging.getLogger(__name__)

MAX_TOKENS = 2048           # larger steps run eagerly: their GPU time hides the launches
_SIZES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)


def mixed_graph_sizes(max_num_batched_tokens: int) -> list[int]:
    """The padded token counts captured: 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, cut at
    max_num_batched_tokens (itself included when below 2048)."""
    limit = min(max_num_batched_tokens, MAX_TOKENS)
    return sorted({s for s in _SIZES if s < limit} | {limit})


class MixedStepGraphs:
    """Captured piecewise graphs of steps up to max(sizes) tokens. `capture(prepare, run_model)` once;
    then per step: stage the inputs padded to `padded_size(T)` (InputStager.stage_eager(step, padded)),
    and inside that step's forward context `replay(padded, T)` -> hidden [T, H]."""

    def __init__(self, sizes: list[int], q_width: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, pool: Any = None, emulate: bool = False) -> None:
        if not sizes:
            raise ValueError("MixedStepGraphs needs at least one size")
        self.sizes = sorted(sizes)
        self.max_tokens = self.sizes[-1]
        # padded[t] = smallest captured size >= t, for t in 0..max_tokens
        index = np.searchsorted(np.array(self.sizes), np.arange(self.max_tokens + 1))
        self.padded = np.array(self.sizes)[index]
        self.q = torch.zeros(self.max_tokens * q_width, dtype=dtype, device=device)       # [maxT * Hq * D]
        self.out = torch.zeros(self.max_tokens * q_width, dtype=dtype, device=device)     # [maxT * Hq * D]
        self.hidden = torch.zeros(self.max_tokens, hidden_size, dtype=dtype, device=device)  # [maxT, H]
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.layers: dict[int, list[Attention]] = {}
        self.run_model: Callable[[int], torch.Tensor] | None = None    # emulate=True: the model body
        self.emulate = emulate
        self.device = device
        # a graph pool handle (the decode graphs'); a new one when None
        self.pool = pool if pool is not None or emulate else torch.cuda.graph_pool_handle()
        self.num_tokens = 0            # real rows of the step being replayed

    def padded_size(self, num_tokens: int) -> int | None:
        """The captured size that runs a step of `num_tokens` tokens, or None (run eagerly)."""
        if not 0 < num_tokens <= self.max_tokens or not (self.pieces or self.run_model is not None):
            return None
        return int(self.padded[num_tokens])

    # ---- the static buffers --------------------------------------------------------------------------
    def q_view(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        return self.q[:_numel(shape)].view(shape)

    def out_view(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        return self.out[:_numel(shape)].view(shape)

    def enter_attention(self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        kv_stored: bool) -> None:
        """The end of a piece: this step's K/V into the cache (unless a fused kernel stored them), q into
        the static buffer."""
        if not kv_stored:
            layer.store_kv(k, v, get_forward_context())
        self.q_view(q.shape).copy_(q)

    def attend(self, layer: Attention, ctx: ForwardContext) -> None:
        """The eager part between two pieces: the real rows of q -> the real rows of out ([n, Hq, D] each)."""
        shape = (self.num_tokens, layer.num_heads, layer.head_dim)
        self.out_view(shape).copy_(layer.attend_cached(self.q_view(shape), ctx))

    # ---- capture and replay --------------------------------------------------------------------------
    def capture(self, prepare: Callable[[int], ForwardContext], run_model: Callable[[int], torch.Tensor]) -> None:
        """Largest size first: `prepare(size)` stages dummy inputs of `size` tokens and returns their
        context, `run_model(size)` runs the model body on them -> hidden [size, H]. One eager run per size
        (JIT compiles), then the pieces are captured."""
        if self.emulate:         # the staged views of each size, as a capture records them
            for size in self.sizes:
                prepare(size)
            self.run_model = run_model
            return
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.device)
        for size in reversed(self.sizes):
            ctx = prepare(size)
            with forward_context(ctx):
                self.hidden[:size] = run_model(size)
            torch.cuda.synchronize(self.device)
            recorder = PieceRecorder(self.pool, self.enter_attention, self.out_view)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), forward_context(dataclasses.replace(ctx, attention_split=recorder.split)):
                recorder.begin()
                self.hidden[:size] = run_model(size)
                recorder.end()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.pieces[size], self.layers[size] = recorder.pieces, recorder.layers
        torch.cuda.synchronize(self.device)
        logger.info("captured mixed-step CUDA graphs for %d token counts (%d..%d, %d pieces each) in %.1f s",
                    len(self.sizes), self.sizes[0], self.sizes[-1], len(self.pieces[self.sizes[0]]),
                    time.perf_counter() - start)

    def replay(self, padded: int, num_tokens: int) -> torch.Tensor:
        """Run a staged step of `num_tokens` tokens padded to `padded` (inside its forward context);
        hidden states [num_tokens, H]."""
        ctx = get_forward_context()
        self.num_tokens = num_tokens
        if self.emulate:
            run_model = self.run_model
            if run_model is None:
                raise RuntimeError("replay before capture")
            with forward_context(dataclasses.replace(ctx, attention_split=self._split_now)):
                self.hidden[:padded] = run_model(padded)
            return self.hidden[:num_tokens]
        pieces = self.pieces[padded]
        for piece, layer in zip(pieces, self.layers[padded], strict=False):   # one more piece than layers
            piece.replay()
            self.attend(layer, ctx)
        pieces[-1].replay()
        return self.hidden[:num_tokens]

    def _split_now(self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   kv_stored: bool) -> torch.Tensor:
        """emulate=True: what a replay does at an attention, done in place."""
        self.enter_attention(layer, q, k, v, kv_stored)
        self.attend(layer, get_forward_context())
        return self.out_view(q.shape)

    def release(self) -> None:
        self.pieces.clear()
        self.layers.clear()
        self.run_model = None


def _numel(shape: torch.Size | tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
