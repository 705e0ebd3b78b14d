"""PinnedStage: a host array to the device through pinned memory, without waiting for the copy: a large
one per step (a structured-output token bitmask, megabytes at batch 256), or a drafting step's row indices
(runner.draft_model_runner: two uploads a step, each in its own buffer).

An array that already lives in page-locked memory (StructuredOutputManager's bitmask buffers when the
runner shares the engine's process) is copied to the device from where it is: no staging copy, no
event. Its owner must not rewrite it before the device ran the copy (the manager refills a buffer
two fills later, after the step that read it was collected).

Other arrays are staged: two pinned buffers alternate (grown when a step needs more); a buffer is
refilled only after its previous copy finished (an event), so the host may stage step N+1 while step
N's copy is queued. On CPU the array is used as it is (the sampler reads it before the step returns).
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
        source = torch.from_numpy(array)
        if not self.on_cuda:
            return source
        if source.is_pinned():     # page-locked already: copied from where it is (see the module docstring)
            return source.to(self.device, non_blocking=True)
        self._current = index = 1 - self._current
        event = self._copied[index]
        if event is not None:
            event.synchronize()                     # that buffer's previous copy was read
        host = self._host[index]
        if host is None or host.dtype != source.dtype or host.numel() < source.numel():
            host = self._host[index] = torch.empty(source.numel(), dtype=source.dtype, pin_memory=True)
        staged = host[:source.numel()].view(source.shape)
        staged.copy_(source)
        tensor = staged.to(self.device, non_blocking=True)
        event = self._copied[index] = torch.cuda.Event()
        event.record()
        return tensor
