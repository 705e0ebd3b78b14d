"""SamplingTensorsSource: the runner's SamplingTensors for a step: a SamplingBatch's arrays on the
device (reusing the static tensors of the previous batch when its static_id is the same), all-greedy
tensors when the step carries no batch, a temperature-only draw over staged inputs (the LM head's
graphs), and the worst case that the memory profile samples with."""
from __future__ import annotations

import numpy as np
import torch

from nv_engine.core.step import SamplingBatch
from nv_engine.runner.input_stager import DrawInputs
from nv_engine.runner.pinned_stage import PinnedStage
from nv_layers.sampler import SamplingTensors


class SamplingTensorsSource:
    """SamplingBatch -> SamplingTensors on `device`."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._static_id = 0
        self._static: dict[str, torch.Tensor] = {}
        self._bitmask_stage = PinnedStage(self.device)

    def for_step(self, batch: SamplingBatch | None, num_rows: int,
                 token_bitmask: np.ndarray | None = None) -> SamplingTensors:
        """The sampler's tensors for a step of `num_rows` sampling rows: greedy without a batch.
        token_bitmask: a structured-output bitmask given apart from the batch (it replaces the
        batch's own)."""
        tensors = self.greedy(num_rows) if batch is None else self.get(batch)
        if token_bitmask is not None:
            tensors.token_bitmask = self._bitmask_stage.upload(token_bitmask)
        return tensors

    def get(self, batch: SamplingBatch) -> SamplingTensors:
        if batch.static_id != self._static_id:
            self._static = {k: self._to_device(v) for k, v in batch.arrays.items()}
            self._static_id = batch.static_id
        seeds_positions = self._to_device(batch.seeds_positions)  # [2, S]
        extra = {name: self._to_device(value) for name in
                 ("prompt_token_ids", "output_token_ids", "banned_token_ids")
                 if (value := getattr(batch, name)) is not None}
        if batch.token_bitmask is not None:   # [S, ceil(V/32)]: megabytes; via pinned memory, no host wait
            extra["token_bitmask"] = self._bitmask_stage.upload(batch.token_bitmask)
        return SamplingTensors(seeds=seeds_positions[0], positions=seeds_positions[1],
                               **self._static, **extra, **batch.flags)

    def greedy(self, num_rows: int) -> SamplingTensors:
        device = self.device
        zeros = torch.zeros(num_rows, device=device)
        return SamplingTensors(
            temperatures=zeros, top_k=torch.zeros(num_rows, dtype=torch.int32, device=device),
            top_p=torch.ones(num_rows, device=device), min_p=zeros,
            seeds=torch.zeros(num_rows, dtype=torch.int64, device=device),
            positions=torch.zeros(num_rows, dtype=torch.int64, device=device),
            all_greedy=True, any_greedy=True, any_top_k=False, any_top_p=False, any_min_p=False)

    @staticmethod
    def temperature_only(draw: DrawInputs) -> SamplingTensors:
        """A draw by temperature alone over `draw`'s rows (0: greedy): the sampler's fast path, whatever the
        values (no filter, penalty or logprob stage; the filters' tensors are never read)."""
        temperatures = draw.temperatures
        return SamplingTensors(
            temperatures=temperatures, top_k=torch.zeros_like(temperatures, dtype=torch.int32),
            top_p=torch.ones_like(temperatures), min_p=torch.zeros_like(temperatures), seeds=draw.seeds,
            positions=draw.positions, all_greedy=False, any_greedy=True, any_top_k=False, any_top_p=False,
            any_min_p=False)

    def worst_case(self, num_rows: int, vocab_size: int | None = None) -> SamplingTensors:
        """Every sampler stage on (the memory profile's worst case; with vocab_size, a grammar's
        token bitmask too)."""
        device = self.device

        def full(value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.full((num_rows,), value, dtype=dtype, device=device)

        return SamplingTensors(
            temperatures=full(0.7), top_k=full(50, torch.int32), top_p=full(0.9), min_p=full(0.05),
            seeds=full(0, torch.int64), positions=full(0, torch.int64), num_logprobs=20,
            need_logprobs=True, presence_penalties=full(0.1), frequency_penalties=full(0.1),
            repetition_penalties=full(1.1),
            output_token_ids=torch.zeros(num_rows, 1, dtype=torch.int64, device=device),
            token_bitmask=None if vocab_size is None else torch.full(
                (num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=device),
            all_greedy=False, any_greedy=True, any_top_k=True, any_top_p=True, any_min_p=True)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)
