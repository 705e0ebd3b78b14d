"""StagedForward: the model body over staged dummy inputs, as the CUDA-graph captures of the runner take it
(decode, verify and mixed-step graphs), and the compile-ahead pass over the same forwards."""
from __future__ import annotations

from collections.abc import Callable

import torch

from nv_engine.runner.input_stager import StagedStep
from nv_kernels.parallel_compile import ParallelTritonCompile
from nv_layers.forward_context import ForwardContext, forward_context

Stage = Callable[[int], StagedStep]     # size -> dummy inputs of that size staged in a graph layout


class StagedForward:
    """model: the runner's causal LM body (ids [T], positions [T] -> hidden [T, H])."""

    def __init__(self, model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device) -> None:
        self.model = model
        self.device = device

    def pair(self, stage: Stage) -> tuple[Callable[[int], ForwardContext], Callable[[int], torch.Tensor]]:
        """The (prepare, run_model) pair a graph capture takes: prepare(size) stages dummy inputs of `size`
        with `stage` and returns their context; run_model(size) runs the model body on the staged ids and
        positions (whose addresses every later step of that size reuses)."""
        inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # size -> staged (ids, positions)

        def prepare(size: int) -> ForwardContext:
            staged = stage(size)
            inputs[size] = (staged.ids, staged.positions)
            return staged.ctx

        def run_model(size: int) -> torch.Tensor:
            ids, positions = inputs[size]
            return self.model(ids, positions)

        return prepare, run_model

    def compile_ahead(self, passes: list[tuple[Stage, list[int]]]) -> None:
        """With an empty Triton cache: compile the kernels the graph captures will meet on a thread pool first, a
        compile-only forward per (stage, size) (ParallelTritonCompile.ahead), instead of one after the other as the
        captures' eager warm-up runs launch them."""
        def forward(stage: Stage, size: int) -> Callable[[], object]:
            def run() -> None:
                prepare, run_model = self.pair(stage)
                with forward_context(prepare(size)):
                    run_model(size)
            return run

        ParallelTritonCompile.ahead(
            self.device, [forward(stage, size) for stage, sizes in passes for size in reversed(sizes)],
            "the CUDA graphs")
