"""PromptLogprobsHead: the logprobs of a prompt chunk's rows (prompt_logprobs), through the model's LM head."""
from __future__ import annotations

import dataclasses

import torch

from nv_engine.core.step import PromptLogprobsBatch, PromptLogprobsResult
from nv_engine.runner.dummy_step_profiler import CausalLM
from nv_layers.forward_context import ForwardContext, forward_context
from nv_layers.sampler import compute_logprobs


class PromptLogprobsHead:
    """`head(hidden, ctx, batch)` after a step's forward -> its PromptLogprobsResult (rank 0; None elsewhere)."""

    # Prompt rows per LM-head pass: bounds the [rows, V] float32 logits of a long prompt chunk.
    ROWS_PER_PASS = 512

    def __init__(self, model: CausalLM, device: torch.device, is_driver: bool) -> None:
        self.model = model
        self.device = device
        self.is_driver = is_driver

    def __call__(self, hidden: torch.Tensor, ctx: ForwardContext,
                 batch: PromptLogprobsBatch) -> PromptLogprobsResult | None:
        """Raw log_softmax (float32) of the prompt rows: each target token's logprob and rank, and
        the top-k. Every rank runs the LM head (its all-gather); rank 0 returns the result."""
        rows = torch.from_numpy(batch.rows).to(self.device)                      # [P]
        targets = torch.from_numpy(batch.target_ids).to(self.device)             # [P]
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        for lo in range(0, rows.shape[0], self.ROWS_PER_PASS):
            hi = lo + self.ROWS_PER_PASS
            with forward_context(dataclasses.replace(ctx, logits_indices=rows[lo:hi])):
                logits = self.model.compute_logits(hidden)                      # [p, V]
            if self.is_driver:
                parts.append(compute_logprobs(logits.float(), targets[lo:hi], batch.num_logprobs))
        if not self.is_driver:
            return None
        chosen = torch.cat([p[0] for p in parts])
        ranks = torch.cat([p[1] for p in parts])
        topk_ids: list[list[int]] = [[] for _ in range(chosen.shape[0])]
        topk_logprobs: list[list[float]] = [[] for _ in range(chosen.shape[0])]
        if batch.num_logprobs > 0:
            topk_ids = torch.cat([p[2] for p in parts if p[2] is not None]).tolist()
            topk_logprobs = torch.cat([p[3] for p in parts if p[3] is not None]).tolist()
        return PromptLogprobsResult(chosen.tolist(), ranks.tolist(), topk_ids, topk_logprobs)
