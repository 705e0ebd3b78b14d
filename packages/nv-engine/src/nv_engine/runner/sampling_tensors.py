"""SamplingTensorsCache: the runner's side of a SamplingBatch: its arrays on the device, reusing the
static tensors of the previous batch when its static_id is the same."""
from __future__ import annotations

import numpy as np
import torch
from nv_layers.sampler import SamplingTensors

from nv_engine.step import SamplingBatch


class SamplingTensorsCache:
    """SamplingBatch -> SamplingTensors on `device`, reusing the static tensors of
    the previous batch when its static_id is the same."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._static_id = 0
        self._static: dict[str, torch.Tensor] = {}

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def get(self, batch: SamplingBatch) -> SamplingTensors:
        if batch.static_id != self._static_id:
            self._static = {k: self._to_device(v) for k, v in batch.arrays.items()}
            self._static_id = batch.static_id
        seeds_positions = self._to_device(batch.seeds_positions)  # [2, S]
        extra = {name: self._to_device(value) for name in
                 ("prompt_token_ids", "output_token_ids", "banned_token_ids")
                 if (value := getattr(batch, name)) is not None}
        return SamplingTensors(seeds=seeds_positions[0], positions=seeds_positions[1],
                               **self._static, **extra, **batch.flags)
