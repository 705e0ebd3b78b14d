"""RejectionSampler on CPU: greedy verification and the target distribution kept under random sampling."""
from __future__ import annotations

import torch
from torch import Tensor

from nv_layers.rejection_sampler import RejectionSampler
from nv_layers.sampler import SamplingTensors

VOCAB = 5
DRAWS = 40_000


def slot_tensors(num_seqs: int, slots: int, temperature: float, top_k: int = 0) -> SamplingTensors:
    """One row per verified slot: sequence i has seed i; slot j samples output position j."""
    rows = num_seqs * slots
    return SamplingTensors(
        temperatures=torch.full((rows,), temperature), top_k=torch.full((rows,), top_k, dtype=torch.int64),
        top_p=torch.ones(rows), min_p=torch.zeros(rows),
        seeds=torch.arange(num_seqs).repeat_interleave(slots), positions=torch.arange(slots).repeat(num_seqs),
        all_greedy=temperature == 0, any_greedy=temperature == 0, any_top_k=top_k > 0, any_top_p=False,
        any_min_p=False, max_top_k=top_k)


def test_greedy_accepts_matching_prefix_then_emits_target_argmax():
    # 3 sequences, K = 3; the target argmax per slot is the row of `best`
    best = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]])
    logits = torch.nn.functional.one_hot(best, VOCAB).float().view(-1, VOCAB) * 5
    drafts = torch.tensor([[1, 2, 0, 0], [1, 2, 3, 9], [0, 0, 0, 0]])[:, :3]
    num_drafts = torch.tensor([3, 3, 2])
    out = RejectionSampler()(logits, drafts, num_drafts, slot_tensors(3, 4, 0.0))
    assert out.num_emitted.tolist() == [3, 4, 3]
    assert out.token_ids.tolist() == [[1, 2, 3, -1], [1, 2, 3, 4], [0, 0, 0, -1]]


def test_no_drafts_emits_one_token():
    logits = torch.randn(2 * 3, VOCAB, generator=torch.Generator().manual_seed(0))
    out = RejectionSampler()(logits, torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                             slot_tensors(2, 3, 0.0))
    assert out.num_emitted.tolist() == [1, 1]
    assert out.token_ids[:, 0].tolist() == logits.view(2, 3, VOCAB)[:, 0].argmax(-1).tolist()


def first_two_frequencies(sampler: RejectionSampler, logits_per_slot: Tensor, draft: list[int],
                          temperature: float = 1.0, top_k: int = 0) -> tuple[Tensor, Tensor]:
    """DRAWS sequences (one seed each) verifying the same drafts: the frequency of the first emitted token,
    and of the second emitted token among the runs whose first token was draft[0]."""
    slots = logits_per_slot.shape[0]
    logits = logits_per_slot.repeat(DRAWS, 1)
    drafts = torch.tensor(draft).expand(DRAWS, -1).contiguous()
    out = sampler(logits, drafts, torch.full((DRAWS,), len(draft)), slot_tensors(DRAWS, slots, temperature, top_k))
    first = torch.bincount(out.token_ids[:, 0], minlength=VOCAB).double() / DRAWS
    kept = out.token_ids[out.token_ids[:, 0] == draft[0], 1]
    kept = kept[kept >= 0]      # a wrong sampler may emit draft[0] without accepting it
    second = torch.bincount(kept, minlength=VOCAB).double() / max(len(kept), 1)
    return first, second


def target(logits: Tensor, temperature: float = 1.0, top_k: int = 0) -> Tensor:
    scaled = logits.double() / temperature
    if top_k:
        scaled = scaled.masked_fill(scaled < scaled.topk(top_k).values[-1], float("-inf"))
    return scaled.softmax(-1)


SLOT_LOGITS = torch.tensor([[0.5, 1.5, -0.3, 0.9, 0.0], [1.0, -1.0, 0.2, 0.4, 2.0], [0.0, 0.0, 0.0, 1.0, 0.5]])
TOLERANCE = 0.012     # ~4.5 standard errors of a frequency at 40k draws (the second slot: ~0.3 of them)


def test_random_sampling_keeps_the_target_distribution():
    first, second = first_two_frequencies(RejectionSampler(), SLOT_LOGITS, [3, 0])
    assert (first - target(SLOT_LOGITS[0])).abs().max() < TOLERANCE
    assert (second - target(SLOT_LOGITS[1])).abs().max() < 2 * TOLERANCE


def test_distribution_with_temperature_and_top_k():
    first, _ = first_two_frequencies(RejectionSampler(), SLOT_LOGITS, [1, 4], temperature=0.7, top_k=3)
    assert (first - target(SLOT_LOGITS[0], 0.7, 3)).abs().max() < TOLERANCE


class _ResidualKeepsDraft(RejectionSampler):
    """A wrong residual (p itself, the draft not removed) over-samples the draft."""

    @staticmethod
    def _residual(probs: Tensor, drafts: Tensor, has_draft: Tensor) -> Tensor:
        return probs


def test_the_distribution_check_catches_a_wrong_residual():
    first, _ = first_two_frequencies(_ResidualKeepsDraft(), SLOT_LOGITS, [3, 0])
    assert (first - target(SLOT_LOGITS[0])).abs().max() > 3 * TOLERANCE


# ---- drafts sampled from a distribution q (a sampling draft model): accept min(1, p/q), residual max(p - q, 0) ----
DRAFT_Q = torch.tensor([[0.05, 0.1, 0.5, 0.3, 0.05], [0.2, 0.2, 0.2, 0.2, 0.2]])


def verify_drafts_from_q(sampler: RejectionSampler, with_q: bool, temperature: float = 1.0,
                         top_k: int = 0) -> tuple[Tensor, float]:
    """DRAWS sequences, each with two drafts drawn from DRAFT_Q's rows: (the frequency of the first emitted token,
    the acceptance rate of the first draft). with_q=False verifies them as point masses."""
    generator = torch.Generator().manual_seed(1)
    drafts = torch.stack([torch.multinomial(DRAFT_Q[j], DRAWS, replacement=True, generator=generator)
                          for j in range(2)], dim=1)                                   # [DRAWS, 2]
    q = DRAFT_Q[None].expand(DRAWS, -1, -1)                                            # [DRAWS, 2, V]
    out = sampler(SLOT_LOGITS.repeat(DRAWS, 1), drafts, torch.full((DRAWS,), 2),
                  slot_tensors(DRAWS, 3, temperature, top_k), q if with_q else None)
    first = torch.bincount(out.token_ids[:, 0], minlength=VOCAB).double() / DRAWS
    return first, (out.num_emitted > 1).double().mean().item()


def test_drafts_from_q_keep_the_target_distribution():
    first, accepted = verify_drafts_from_q(RejectionSampler(), with_q=True)
    assert (first - target(SLOT_LOGITS[0])).abs().max() < TOLERANCE
    expected = torch.minimum(target(SLOT_LOGITS[0]), DRAFT_Q[0].double()).sum().item()   # 1 - TV(p, q)
    assert abs(accepted - expected) < TOLERANCE
    first, _ = verify_drafts_from_q(RejectionSampler(), with_q=True, temperature=0.7, top_k=3)
    assert (first - target(SLOT_LOGITS[0], 0.7, 3)).abs().max() < TOLERANCE


def test_the_point_mass_rule_is_exact_for_any_drafts_but_accepts_less():
    """Verified as point masses (accept with p(d)), drafts from any q keep p too: the rule is exact given each
    draft. It accepts E_q[p(d)] instead of 1 - TV(p, q)."""
    first, accepted = verify_drafts_from_q(RejectionSampler(), with_q=False)
    assert (first - target(SLOT_LOGITS[0])).abs().max() < TOLERANCE
    _, accepted_with_q = verify_drafts_from_q(RejectionSampler(), with_q=True)
    assert accepted < accepted_with_q - 0.1


class _AcceptanceIgnoresQ(RejectionSampler):
    """A wrong acceptance for drafts from q: p(d), with the residual max(p - q, 0) of the q-aware rule."""

    @staticmethod
    def _acceptance(p_draft: Tensor, q_draft: Tensor | None) -> Tensor:
        return p_draft


class _ResidualIgnoresQ(RejectionSampler):
    """The right acceptance for drafts from q, a wrong residual (p itself instead of max(p - q, 0))."""

    @staticmethod
    def _residual_from(probs: Tensor, draft_probs: Tensor, has_draft: Tensor) -> Tensor:
        return probs


def test_the_distribution_check_catches_broken_rules_for_drafts_from_q():
    for broken in (_AcceptanceIgnoresQ(), _ResidualIgnoresQ()):
        first, _ = verify_drafts_from_q(broken, with_q=True)
        assert (first - target(SLOT_LOGITS[0])).abs().max() > 3 * TOLERANCE, type(broken).__name__
