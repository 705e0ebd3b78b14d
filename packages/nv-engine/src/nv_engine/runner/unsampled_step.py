"""UnsampledStep: a step the ModelRunner launched with defer_sampling, its logits waiting for `sample()`."""
from __future__ import annotations

from typing import NamedTuple

import torch

from nv_engine.core.step import PromptLogprobsResult, SamplingBatch


class UnsampledStep(NamedTuple):
    logits: torch.Tensor                               # [S, V]
    sampling: SamplingBatch | None
    prompt_logprobs: PromptLogprobsResult | None
