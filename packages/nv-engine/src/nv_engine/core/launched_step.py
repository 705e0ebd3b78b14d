"""LaunchedStep: a step the engine core handed to the runner and has not collected yet."""
from __future__ import annotations

from dataclasses import dataclass

from nv_engine.core.step import PromptLogprobsBatch, SamplingBatch, StepResult
from nv_kvcache import SchedulerOutput


@dataclass
class LaunchedStep:
    """A step handed to the runner: its schedule, sampler inputs, and (synchronous runs) its result."""

    out: SchedulerOutput
    batch: SamplingBatch | None
    result: StepResult | None
    tokens: tuple[int, int]          # (prompt tokens computed, tokens sampled)
    prompt_logprobs: PromptLogprobsBatch | None = None
