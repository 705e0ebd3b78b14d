"""Lossless verification of draft tokens (speculative decoding) on the device, with no host sync.

Rows: S sequences x (K+1) verified slots, flattened to [S * (K+1), V] logits: slot j < K scores draft j,
slot K (or the first slot past a sequence's drafts) gives the bonus token. The SamplingTensors have one row
per verified slot too (the caller repeats each sequence's parameters, positions = output index + j), so a
seeded request draws from the same counter-based noise the Sampler uses.

Per sequence (the standard speculative-sampling rule, Leviathan et al. / Chen et al. 2023, as vLLM v1 does
it), with q the distribution each draft was drawn from:
- greedy rows (temperature 0): accept draft j while it equals the target argmax; the first mismatch emits
  the target argmax there; all accepted: the argmax of the last slot is the bonus token;
- random rows: p = softmax of the processed logits (temperature, min-p, top-k, top-p, as the Sampler);
  accept d with probability min(1, p(d) / q(d)); on rejection sample from normalize(max(p - q, 0)); all
  accepted: the bonus token is sampled from p at the last slot. Without draft_probs q is a point mass,
  q = one-hot(d) (n-gram lookup, greedy drafts): accept with p(d), residual p with d removed.
The emitted run is (accepted drafts..., one recovered or bonus token): 1 to K+1 tokens per sequence.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from nv_kernels.sampler_hash import gumbel_noise, mix32, row_keys, token_keys, uniform_from_bits
from nv_layers.sampler import SamplingTensors, apply_min_p, apply_top_k_top_p

# Salts the acceptance draws' keys so they are independent of the Gumbel noise of the same (seed, position).
_ACCEPT_SALT = 0x5BD1E995


class RejectionOutput(NamedTuple):
    token_ids: Tensor     # [S, K+1] int64: the emitted run, padded with -1 after num_emitted
    num_emitted: Tensor   # [S] int64 in [1, K+1]: accepted drafts + 1


class RejectionSampler(nn.Module):
    def forward(self, logits: Tensor, draft_ids: Tensor, num_drafts: Tensor, t: SamplingTensors,
                draft_probs: Tensor | None = None) -> RejectionOutput:
        """logits: [S * (K+1), V] (after token constraints / penalties); draft_ids: [S, K] int64 (entries at or
        past num_drafts are ignored); num_drafts: [S] int64 in [0, K]; t: one row per verified slot;
        draft_probs: [S, K, V] the distribution q each random row's draft was sampled from (None: point masses;
        greedy rows always compare with the target argmax)."""
        num_seqs, k = draft_ids.shape
        slots = k + 1
        if logits.dim() != 2 or logits.shape[0] != num_seqs * slots:
            raise ValueError(f"logits must be [S * (K+1), V] = [{num_seqs * slots}, V], got {tuple(logits.shape)}")
        vocab = logits.shape[1]
        logits = logits.float()
        device = logits.device
        slot_idx = torch.arange(k, device=device)
        has_draft = slot_idx[None, :] < num_drafts[:, None]                     # [S, K]
        drafts = torch.where(has_draft, draft_ids, torch.zeros_like(draft_ids))  # valid gather indices
        target_argmax = logits.argmax(dim=-1).view(num_seqs, slots)             # [S, K+1]
        if t.all_greedy:
            accepted = (drafts == target_argmax[:, :k]) & has_draft
            emitted_at = target_argmax
        else:
            probs = self.processed_probs(logits, t)                               # [S*(K+1), V]
            probs3 = probs.view(num_seqs, slots, vocab)
            p_draft = probs3[:, :k].gather(2, drafts[:, :, None]).squeeze(2)    # [S, K]
            q_draft = None if draft_probs is None else draft_probs.float().gather(2, drafts[:, :, None]).squeeze(2)
            ratio = self._acceptance(p_draft, q_draft)                          # [S, K]
            keys = row_keys(t.seeds, t.positions)                               # [S*(K+1)]
            uniforms = uniform_from_bits(mix32(keys ^ _ACCEPT_SALT)).view(num_seqs, slots)[:, :k]
            greedy = (t.temperatures <= 0).view(num_seqs, slots)
            accepted = torch.where(greedy[:, :k], drafts == target_argmax[:, :k], uniforms < ratio) & has_draft
            # the residual at a slot holding a draft: max(p - q, 0); the bonus slot keeps p
            residual = (self._residual(probs3, drafts, has_draft) if draft_probs is None
                        else self._residual_from(probs3, draft_probs.float(), has_draft)).view(-1, vocab)
            noise = gumbel_noise(keys, token_keys(vocab, device))
            sampled = (residual.log() + noise).argmax(dim=-1).view(num_seqs, slots)
            emitted_at = torch.where(greedy, target_argmax, sampled)
        num_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)       # [S]: the accepted prefix
        # the run: drafts before num_accepted, then the recovered / bonus token at slot num_accepted
        all_slots = torch.arange(slots, device=device)[None, :]
        padded_drafts = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], dim=1)
        last = emitted_at.gather(1, num_accepted[:, None])                      # [S, 1]
        token_ids = torch.where(all_slots < num_accepted[:, None], padded_drafts, last)
        token_ids = token_ids.masked_fill(all_slots > num_accepted[:, None], -1)
        return RejectionOutput(token_ids, num_accepted + 1)

    @staticmethod
    def _residual(probs: Tensor, drafts: Tensor, has_draft: Tensor) -> Tensor:
        """normalize(max(p - q, 0)) for q = one-hot(draft), unnormalised: p with the draft set to 0 at the slots
        holding a draft; the bonus slot (and slots past the drafts) keep p. probs: [S, K+1, V]."""
        k = drafts.shape[1]
        remove = torch.zeros_like(probs, dtype=torch.bool)
        remove[:, :k].scatter_(2, drafts[:, :, None], has_draft[:, :, None])
        return probs.masked_fill(remove, 0.0)

    @staticmethod
    def _acceptance(p_draft: Tensor, q_draft: Tensor | None) -> Tensor:
        """The probability of accepting each draft (a uniform below it accepts): min(1, p(d) / q(d)); p(d) for a
        point mass. q(d) > 0 wherever a draft was drawn from q (clamped against padding slots)."""
        return p_draft if q_draft is None else p_draft / q_draft.clamp_min(1e-30)

    @staticmethod
    def _residual_from(probs: Tensor, draft_probs: Tensor, has_draft: Tensor) -> Tensor:
        """normalize(max(p - q, 0)), unnormalised, at the slots holding a draft (p where that is all zeros: a
        rejection there has probability 0, up to rounding); the bonus slot keeps p. probs: [S, K+1, V],
        draft_probs: [S, K, V]."""
        k = draft_probs.shape[1]
        residual = probs.clone()
        excess = (probs[:, :k] - draft_probs).clamp_min_(0.0)                  # [S, K, V]
        usable = has_draft & (excess.sum(dim=2) > 0)                           # [S, K]
        residual[:, :k] = torch.where(usable[:, :, None], excess, probs[:, :k])
        return residual

    @staticmethod
    def processed_probs(logits: Tensor, t: SamplingTensors) -> Tensor:
        """A model's processed distribution per row, as the Sampler draws from it (temperature, min-p, top-k,
        top-p; greedy rows at T = 1): the target's p here, a sampling draft model's q. logits: float32."""
        temps = t.temperatures.to(logits.dtype)
        temps = torch.where(temps <= 0, torch.ones_like(temps), temps)
        scaled = logits / temps[:, None]
        if t.any_min_p:
            scaled = apply_min_p(scaled, t.min_p)
        if t.any_top_k or t.any_top_p:
            scaled = apply_top_k_top_p(scaled, t)
        return scaled.softmax(dim=-1)
