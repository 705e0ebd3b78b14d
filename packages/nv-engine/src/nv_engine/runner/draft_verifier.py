"""DraftVerifier: the runner's sampling of a step that verifies draft tokens (speculative decoding)."""
from __future__ import annotations

import dataclasses

import torch

from nv_engine.core.step import StepInput
from nv_engine.runner.draft_proposal import DraftProposal
from nv_layers.rejection_sampler import RejectionSampler
from nv_layers.sampler import SamplerOutput, SamplingTensors


class DraftVerifier:
    """Expands the step's per-sequence sampling tensors to one row per verified slot (slot j of a sequence
    samples output position positions + j) and runs the RejectionSampler. The engine sends drafts only in steps
    whose rows need nothing beyond temperature / top-k / top-p / min-p (no logprobs, penalties, token bans or
    bitmasks), so those are the only fields expanded."""

    def __init__(self) -> None:
        self.rejection_sampler = RejectionSampler()

    def __call__(self, logits: torch.Tensor, step: StepInput, tensors: SamplingTensors,
                 proposal: DraftProposal | None = None,
                 staged: tuple[torch.Tensor, torch.Tensor] | None = None) -> SamplerOutput:
        """logits: [S * (K+1), V] at step.logits_indices; proposal: a draft model's drafts on the device (and the
        distributions they were drawn from), None: step.draft_ids; staged: step.draft_ids [S, K] and step.num_drafts
        [S] already on the device (InputStager), None: copied now. Returns the emitted runs flattened to
        [S * (K+1)] token ids, K+1 per sequence, padded with -1 after each run."""
        if step.draft_ids is None or step.num_drafts is None:
            raise RuntimeError("DraftVerifier needs a step with draft tokens")
        if tensors.any_logits_processing or tensors.any_penalties or tensors.need_logprobs or tensors.num_logprobs:
            raise RuntimeError("a step with draft tokens has rows that need logprobs, penalties or token bans")
        device = logits.device
        if staged is None:
            staged = torch.from_numpy(step.draft_ids).to(device), torch.from_numpy(step.num_drafts).to(device)
        draft_ids = staged[0] if proposal is None else proposal.ids                # [S, K]
        num_drafts = staged[1]                                                     # [S]
        slots = draft_ids.shape[1] + 1
        slot_offsets = torch.arange(slots, device=device).repeat(draft_ids.shape[0])  # [S * (K+1)]
        per_slot = dataclasses.replace(
            tensors, temperatures=tensors.temperatures.repeat_interleave(slots),
            top_k=tensors.top_k.repeat_interleave(slots), top_p=tensors.top_p.repeat_interleave(slots),
            min_p=tensors.min_p.repeat_interleave(slots), seeds=tensors.seeds.repeat_interleave(slots),
            positions=tensors.positions.repeat_interleave(slots) + slot_offsets)
        out = self.rejection_sampler(logits, draft_ids, num_drafts, per_slot,
                                     None if proposal is None else proposal.probs)
        return SamplerOutput(out.token_ids.reshape(-1), None, None, None, None)
