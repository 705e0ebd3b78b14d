"""PieceRecorder: captures one padded size of the mixed-step graphs (runner/mixed_graphs.py) as a list of CUDA
graphs, ending the graph in progress at each attention and beginning the next one after it."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nv_layers.attention import Attention

# (layer, q [T, Hq, D], k, v [T, Hkv, D], kv_stored): what the piece must still do before the attention
EnterAttention = Callable[[Attention, torch.Tensor, torch.Tensor, torch.Tensor, bool], None]


class PieceRecorder:
    """`begin()`, run the model body with `split` as the forward context's attention_split, `end()`: then
    `pieces` holds one graph more than `layers` (the attention layers between them, in order)."""

    def __init__(self, pool: Any, enter_attention: EnterAttention,
                 out_view: Callable[[torch.Size], torch.Tensor]) -> None:
        self.pool = pool                           # the graph pool handle every piece allocates from
        self.enter_attention = enter_attention
        self.out_view = out_view                   # shape [T, Hq, D] -> the shared attention-output buffer
        self.pieces: list[torch.cuda.CUDAGraph] = []
        self.layers: list[Attention] = []
        self.current: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=self.pool)

    def end(self) -> None:
        if self.current is None:
            raise RuntimeError("no graph is being captured")
        self.current.capture_end()
        self.pieces.append(self.current)
        self.current = None

    def split(self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_stored: bool) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D] -> the shared output buffer as [T, Hq, D]
        self.enter_attention(layer, q, k, v, kv_stored)
        self.layers.append(layer)
        self.end()
        self.begin()
        return self.out_view(q.shape)
