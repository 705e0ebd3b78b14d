"""The persistent scratch memory of the skinny GEMM's split-K: fp32 partial sums and per-column-block arrival
counters, one pair per device.

Each split of a column block writes its partial sums, then increments the block's int32 counter; the program
that arrives last adds the partials up, writes the output and puts the counter back to 0. So the counters are
zero between kernels: the buffers are reused by every call without a fill, which keeps a captured CUDA graph
free of allocations and memsets. Invariants:
  - one stream per device: two skinny GEMMs that run concurrently would share (and corrupt) the buffers;
  - buffers only grow outside CUDA-graph capture (the engine runs every captured batch size eagerly first);
    a grown buffer replaces the old one, which stays alive because graphs captured before still use it.
"""
from __future__ import annotations

import torch
from torch import Tensor


class SplitKWorkspace:
    """Per-device fp32 partial-sum buffer and zeroed int32 counters, grown on demand outside capture."""

    def __init__(self) -> None:
        self._partials: dict[torch.device, Tensor] = {}
        self._counters: dict[torch.device, Tensor] = {}
        self._retired: list[Tensor] = []          # replaced buffers a captured graph may still read

    def partials(self, device: torch.device, numel: int) -> Tensor:
        """A flat fp32 buffer of at least `numel` elements (contents undefined)."""
        return self._buffer(self._partials, device, numel, torch.float32)

    def counters(self, device: torch.device, numel: int) -> Tensor:
        """At least `numel` int32 arrival counters, all 0 (the kernels leave them so)."""
        return self._buffer(self._counters, device, numel, torch.int32)

    def _buffer(self, buffers: dict[torch.device, Tensor], device: torch.device, numel: int,
                dtype: torch.dtype) -> Tensor:
        current = buffers.get(device)
        if current is not None and current.numel() >= numel:
            return current
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the skinny GEMM's split-K workspace must grow during CUDA-graph capture: run "
                               "this shape once eagerly before capturing it")
        if current is not None:
            self._retired.append(current)
        size = max(numel, 2 * current.numel() if current is not None else 0)
        grown = torch.zeros(size, dtype=dtype, device=device)   # counters start at 0; partials need no fill
        buffers[device] = grown
        return grown
