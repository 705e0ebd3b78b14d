"""VerifyGraphs: speculative decoding's verify steps in full CUDA graphs, as decode steps.

A step that verifies drafts has 1 + d_b query tokens per sequence: not a pure decode, so without these graphs it
runs eagerly or through the piecewise graphs of mixed steps, with an eager attention per layer between the pieces
(at batch 1 on an H100 a verify step cost ~3.6 decode steps). Here each sequence gets a fixed Q = 1 + k rows
(runner.verify_layout: front padding), so a verify step of B sequences has the static shape [B * Q] and replays one
graph per captured batch size up to speculative_config.max_batch_size, attention included (the backend's
decode_queries: Q query tokens per sequence in one decode kernel). The LM head and the rejection sampler run
eagerly after the replay on the rows the verifier reads. The graphs share the decode graphs' memory pool.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.step import StepInput
from nv_engine.runner.cuda_graphs import DecodeGraphs
from nv_engine.runner.input_stager import InputStager, StagedStep
from nv_engine.runner.verify_layout import VerifyLayout
from nv_kernels import AttentionBackend
from nv_layers.forward_context import ForwardContext


class VerifyGraphs:
    """Per step: `padded_size(step)` (None: not a verify step these graphs run), `stage(padded, step)`, then
    `replay(padded, B)` -> hidden [B * Q, H] (the rows StagedStep.logits_rows picks)."""

    def __init__(self, max_batch_size: int, query_len: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, stager: InputStager, emulate: bool = False) -> None:
        self.layout = VerifyLayout(query_len)
        self.query_len = query_len
        self.stager = stager
        self.graphs = DecodeGraphs(max_batch_size, hidden_size, dtype, device, emulate=emulate,
                                   rows_per_seq=query_len)
        self.sizes = self.graphs.sizes

    @classmethod
    def build(cls, config: EngineConfig, backend: AttentionBackend, stager: InputStager, device: torch.device,
              emulate: bool) -> VerifyGraphs | None:
        """The verify graphs of this engine: batch sizes up to speculative_config.max_batch_size (and max_num_seqs,
        and the token budget over Q); None without speculative decoding or with a backend that has no
        decode_queries (nv_kernels.interface.DecodesQueries: its verify steps keep the mixed-step path)."""
        spec = config.speculative_config
        if spec is None or not hasattr(backend, "decode_queries"):
            return None
        query_len = 1 + spec.num_speculative_tokens
        max_batch_size = min(spec.max_batch_size, config.max_num_seqs, config.max_num_batched_tokens // query_len)
        if max_batch_size < 1:
            return None
        return cls(max_batch_size, query_len, config.hf_config.hidden_size, config.dtype, device, stager, emulate)

    def padded_size(self, step: StepInput) -> int | None:
        """The captured batch size that runs this step, or None (not a verify step that fits, or too large)."""
        if not self.graphs.graphs or not self.layout.fits(step):
            return None
        return self.graphs.padded_size(step.num_seqs)

    def stage(self, padded: int, step: StepInput) -> StagedStep:
        return self.stager.stage_verify(padded, self.query_len, step, self.layout.rows(step))

    def stage_dummy(self, padded: int) -> StagedStep:
        """The inputs a capture of `padded` sequences records (the addresses every later step of that size uses)."""
        return self.stager.stage_verify(padded, self.query_len)

    def capture(self, prepare: Callable[[int], ForwardContext], run_model: Callable[[int], torch.Tensor],
                pool: Any = None) -> None:
        """DecodeGraphs.capture over the verify layout: prepare(bs) stages `stage_dummy(bs)`, run_model(bs) runs the
        model body on it -> [bs * Q, H]; pool: the graph pool to share (the decode graphs')."""
        self.graphs.pool = pool
        self.graphs.capture(prepare, run_model)

    def replay(self, padded: int, batch: int) -> torch.Tensor:
        return self.graphs.replay(padded, batch)                                   # [B * Q, H]

    def release(self) -> None:
        self.graphs.release()
