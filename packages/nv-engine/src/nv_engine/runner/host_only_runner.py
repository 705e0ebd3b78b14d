"""HostOnlyRunner: the ModelRunner's host side of a step without the model, for measuring the
engine core's own per-step work (benchmarks/bench_core_step.py).

It stages each step's inputs as the ModelRunner does (InputStager: the CUDA-graph decode layout for
pure decode steps, the eager layout otherwise; SamplingTensorsSource for the sampler's tensors) and
takes the previous step's sampled ids for placeholder rows, then "samples" fixed pseudo-random ids
per row (never 0, the id a benchmark passes as EOS) without a forward. It returns StepResults like
the ModelRunner's, so the engine core runs unchanged.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.step import StepInput, StepResult
from nv_engine.runner.cuda_graphs import graph_batch_sizes
from nv_engine.runner.input_stager import InputStager
from nv_engine.runner.sampling_tensors import SamplingTensorsSource
from nv_kernels import get_backend


class HostOnlyRunner:
    """A runner (executor's `runner_cls`) whose forward is nothing: steps cost only their host work."""

    def __init__(self, config: EngineConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.device = torch.device("cuda" if config.is_cuda else "cpu")
        self.vocab_size = int(config.hf_config.vocab_size)
        self.stager = InputStager(get_backend("torch", self.device), max_model_len=config.max_model_len,
                                  max_blocks_per_seq=config.max_blocks_per_seq,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  max_num_seqs=config.max_num_seqs, device=self.device)
        self.sampling_tensors = SamplingTensorsSource(self.device)
        sizes = np.array(graph_batch_sizes(config.max_num_seqs))
        # padded[b]: the captured decode size a batch of b rows replays (as DecodeGraphs pads)
        self.padded = sizes[np.minimum(np.searchsorted(sizes, np.arange(config.max_num_seqs + 1)), len(sizes) - 1)]
        generator = torch.Generator().manual_seed(config.seed)
        self.ids = torch.randint(1, self.vocab_size, (max(config.max_num_seqs, config.max_num_batched_tokens),),
                                 generator=generator).to(self.device)   # row i always samples ids[i]
        self.last_sampled: torch.Tensor | None = None     # [S] of the last launched step
        self.pending: deque[torch.Tensor] = deque()        # [S] sampled ids per uncollected step
        self.unsampled_rows: int | None = None             # a defer_sampling step's row count

    def determine_num_blocks(self) -> int:
        config = self.config
        if config.num_gpu_blocks_override is not None:
            return config.num_gpu_blocks_override
        return config.max_num_seqs * config.max_blocks_per_seq

    def allocate_kv_cache(self, num_blocks: int) -> None:
        pass

    def capture_cudagraphs(self) -> None:
        pass

    def execute(self, step: StepInput) -> StepResult:
        self.launch(step)
        return self.collect()

    def launch(self, step: StepInput) -> None:
        if step.is_decode:
            staged = self.stager.stage_decode(int(self.padded[step.num_seqs]), step)
        else:
            staged = self.stager.stage_eager(step)
        if staged.prev_rows is not None and self.last_sampled is not None:
            staged.ids[staged.prev_rows] = self.last_sampled[staged.prev_src]
        num_rows = len(step.logits_indices)
        if step.defer_sampling:
            self.unsampled_rows = num_rows
            return
        self._sample(step, num_rows)

    def sample(self, token_bitmask: np.ndarray | None) -> None:
        num_rows, self.unsampled_rows = self.unsampled_rows, None
        if num_rows is None:
            raise RuntimeError("sample() without a step launched with defer_sampling")
        self._emit(num_rows)

    def _sample(self, step: StepInput, num_rows: int) -> None:
        if num_rows:
            self.sampling_tensors.for_step(step.sampling, num_rows)
        self._emit(num_rows)

    def _emit(self, num_rows: int) -> None:
        self.last_sampled = self.ids[:num_rows]                                      # [S]
        self.pending.append(self.last_sampled)

    def collect(self) -> StepResult:
        return StepResult(token_ids=self.pending.popleft().tolist())

    def shutdown(self) -> None:
        self.pending.clear()
