"""Host -> device staging: many small arrays of one dtype in one transfer.

A step's metadata (ids, positions, slots, lengths, block tables) is written with numpy into a
pinned host buffer back to back, then copied to a device buffer of the same layout with one
non-blocking copy. Views into the device buffer are the step's input tensors. For CUDA graphs the
layout of a decode step depends only on the padded batch size, so every replay of a graph writes its
inputs to the addresses the graph was captured with.

Two host buffers alternate, and a buffer is reused only after its previous copy has finished (an
event), so the CPU may fill step N+1's inputs while step N's copy is still queued.
On CPU the host buffer is the device buffer: no copy at all.
Every view starts 16-byte aligned: Triton specialises kernels on pointer alignment, so views at
offsets that depend on the batch would compile new kernel variants mid-run (and lose vector loads).
"""
from __future__ import annotations

import numpy as np
import torch


class StagingBuffer:
    """Stages arrays of one dtype; `begin()`, then `put*()` returning device views, then `upload()`."""

    MAX_VIEWS = 64  # views per step that the padding for alignment is reserved for
    MAX_CACHED_VIEWS = 1024  # distinct (buffer, offset, shape) views kept for reuse

    def __init__(self, dtype: torch.dtype, capacity: int, device: torch.device) -> None:
        self.align = max(1, 16 // torch.empty(0, dtype=dtype).element_size())   # elements per 16 bytes
        capacity += self.MAX_VIEWS * self.align
        self.device = device
        self.on_cuda = device.type == "cuda"
        num_host = 2 if self.on_cuda else 1
        self.host = [torch.zeros(capacity, dtype=dtype, pin_memory=self.on_cuda) for _ in range(num_host)]
        self.host_np = [h.numpy() for h in self.host]
        self.device_buf = torch.zeros(capacity, dtype=dtype, device=device) if self.on_cuda else None
        self.copy_done: list[torch.cuda.Event | None] = [None] * num_host
        self.capacity = capacity
        self.current = 0
        self.offset = 0
        # (host buffer, start, shape) -> the view: a step's layout mostly repeats (always, for one
        # CUDA-graph size), and slicing a tensor costs more than a dict lookup
        self._views: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}

    def begin(self) -> None:
        """Start a new step's layout at offset 0 in the next host buffer."""
        self.current = (self.current + 1) % len(self.host)
        event = self.copy_done[self.current]
        if event is not None:
            event.synchronize()  # that buffer's previous copy must have been read already
        self.offset = 0

    def _reserve(self, n: int) -> int:
        start = -(-self.offset // self.align) * self.align
        if start + n > self.capacity:
            raise AssertionError(f"staging buffer overflow: {start + n} > {self.capacity}")
        self.offset = start + n
        return start

    def _view(self, start: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The device view of `shape` at `start` (one shared view per layout: writes through it
        reach the buffer, as with a fresh slice)."""
        key = (self.current, start, shape)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= self.MAX_CACHED_VIEWS:
                self._views.clear()
            buf = self.device_buf if self.device_buf is not None else self.host[self.current]  # None: on CPU
            n = 1
            for size in shape:
                n *= size
            view = self._views[key] = buf[start:start + n].view(shape)
        return view

    def put(self, values: np.ndarray, n: int | None = None, fill: int | float = 0) -> torch.Tensor:
        """Stage `values` [k] into a slot of n >= k elements (tail = fill); device view [n]."""
        k = len(values)
        n = k if n is None else n
        start = self._reserve(n)
        host = self.host_np[self.current]
        host[start:start + k] = values
        if n > k:
            host[start + k:start + n] = fill
        return self._view(start, (n,))

    def put_rows(self, values: np.ndarray, n_rows: int, n_cols: int) -> torch.Tensor:
        """Stage a [b, m] array into an [n_rows, n_cols] slot (b <= n_rows, m <= n_cols); the
        uncovered part keeps whatever the buffer held (callers never read it). Device view [n_rows, n_cols]."""
        b, m = values.shape
        start = self._reserve(n_rows * n_cols)
        host = self.host_np[self.current][start:start + n_rows * n_cols].reshape(n_rows, n_cols)
        host[:b, :m] = values
        return self._view(start, (n_rows, n_cols))

    def upload(self) -> None:
        """Queue the copy of everything staged since begin() (non-blocking on CUDA)."""
        if self.device_buf is None or self.offset == 0:   # None: on CPU, the host buffer is the input
            return
        self.device_buf[:self.offset].copy_(self.host[self.current][:self.offset], non_blocking=True)
        event = self.copy_done[self.current] or torch.cuda.Event()
        event.record()
        self.copy_done[self.current] = event
