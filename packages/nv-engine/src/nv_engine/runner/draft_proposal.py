"""DraftProposal: a draft model's drafts of one step, on the device (runner.draft_model_runner)."""
from __future__ import annotations

from typing import NamedTuple

import torch


class DraftProposal(NamedTuple):
    ids: torch.Tensor                  # [S, K] int64, 0 past a sequence's drafts
    # [S, K, V] float32: the distribution q each random row's draft was drawn from (draft_sampling "sampled");
    # None: every draft is a point mass (greedy drafting)
    probs: torch.Tensor | None
