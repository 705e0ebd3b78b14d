"""PinnedStage: one large host array per step (a structured-output token bitmask, megabytes at
batch 256) to the device through preallocated pinned memory, without waiting for the copy.

Two pinned buffers alternate (grown when a step needs more); a buffer is refilled only after its
previous copy finished (an event), so the host may stage step N+1 while step N's copy is queued.
On CPU the array is used as it is (the sampler reads it before the step returns).
"""
from __future__ import annotations

import numpy as np
import torch


class PinnedStage:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self._host: list[torch.Tensor | None] = [None, None]        # pinned, flat
        self._copied: list[torch.cuda.Event | None] = [None, None]  # recorded after each buffer's copy
        self._current = 0

    def upload(self, array: np.ndarray) -> torch.Tensor:
        """`array` on the device (a new tensor; the copy is queued on the current stream)."""
        if not self.on_cuda:
            return torch.from_numpy(array)
        self._current = index = 1 - self._current
        event = self._copied[index]
        if event is not None:
            event.synchronize()                     # that buffer's previous copy was read
        host = self._host[index]
        dtype = torch.from_numpy(array[:0]).dtype
        if host is None or host.dtype != dtype or host.numel() < array.size:
            host = self._host[index] = torch.empty(array.size, dtype=dtype, pin_memory=True)
        staged = host[:array.size].view(array.shape)
        staged.numpy()[...] = array
        tensor = staged.to(self.device, non_blocking=True)
        event = self._copied[index] = torch.cuda.Event()
        event.record()
        return tensor
