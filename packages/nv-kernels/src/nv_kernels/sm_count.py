"""The streaming-multiprocessor count of a CUDA device, the one fact the kernels' launch heuristics read."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def cuda_sm_count(device: torch.device) -> int | None:
    """The device's SM count; None off CUDA (each heuristic picks its own stand-in there)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count
