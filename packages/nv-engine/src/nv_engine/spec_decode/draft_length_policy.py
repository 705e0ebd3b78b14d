"""DraftLengthPolicy: how many draft tokens a sequence proposes in a drafting step, 0 to num_speculative_tokens (K),
from its own recent acceptance. Method-agnostic: it sees draft counts and accepted counts only; the method enters
through the step costs (speculative_decoding.POLICY_COSTS: for ngram a drafting step costs its synchronous
verification, for draft_model the draft's forwards too). Outputs do not depend on it: drafts are verified
losslessly whatever their number; it only decides which steps draft and how much.

The rule (the goodput rule of SmartSpec, Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large
Language Models Using Goodput", on the expected-tokens model of Leviathan et al. 2023):
- model: each draft token is accepted with probability a, given the ones before it were. A step with k drafts then
  emits E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens (the accepted prefix and one more);
- cost, in pipelined plain decode steps: C(0) = 1; C(k) = verify_cost + draft_token_cost * k for k >= 1. A step
  with drafts runs synchronously (the next proposal needs its accepted tokens), so it loses the pipelining of the
  host work behind the GPU: about twice a plain step at batch 1 (verify_cost 2.0), growing little with k there
  (draft_token_cost 0.05: ngram's defaults; a draft model's forwards cost more per draft token);
- choose k = argmax over 0..K of E(k) / C(k), tokens per unit of time: k = 0 (no drafts) unless some k >= 1
  gives E(k) > C(k). With the defaults, K = 3 drafts where a >= 0.59, K = 5 and 7 where a >= about 0.58, and
  nothing below. The argmax per a is tabulated once (LEVELS + 1 entries), so a step costs a table lookup per
  sequence.
The cost is the batch-1 view of one sequence. A batch shares one step: it is synchronous once any sequence drafts,
so the batch rule (`batch_pays`) weighs the whole batch: a drafting step pays where the running sequences' expected
tokens in it exceed B C(mean drafts), what B pipelined plain steps of the batch would give for its cost. A sequence
expects 1 + f (E(k) - 1) tokens, f its find rate: of the drafting steps that asked it for drafts, the share in
which the proposer found some (decayed as the acceptance; an ngram lookup finds nothing in text it has not seen
repeated). A stopped sequence expects 1, a new one E(K) at the prior acceptance. So a batch where a third of the
sequences find drafts in a step, accepted at 0.77, pipelines (1.6 expected tokens against C = 2.05), which the
per-sequence rule alone could not see (each such sequence's k is 3). Measured before the rule (one H100, ngram k 3,
random prompts): batches 8-64 at 0.80-0.94x of plain with acceptance 0.77-0.82, at 1.0-1.25 drafted tokens per
sequence and step of the 3 allowed.

The estimate of a: exponentially decayed counts (DraftAcceptance), per drafting step `decay` times the old ones
plus the new: accepted tokens, and tested ones (the accepted plus the first rejected, where one was). accepted /
tested is the maximum-likelihood estimate of a under the model (tokens after the first rejection tell nothing);
accepted / drafted would understate it for long drafts. A probe (a new sequence's first draft, or the first after
a stop) starts the counts from the prior (prior_acceptance, weighing prior_weight tested tokens), then adds its
own: a sequence whose probe is wholly rejected stops at once; one whose drafts were all accepted for long and
then all fail stops after 5 (K = 3) to 9 (K = 7) such steps.

Stopping and probing: a sequence whose k falls to 0 proposes nothing until it has grown by its backoff in tokens,
then drafts K once (the probe: a step with any drafts pays the synchronous cost, so a full draft tells the most
for it). The backoff starts at min_backoff and doubles at each stop up to max_backoff, so text that stays
unpredictable costs about one losing step per max_backoff tokens; it goes back to min_backoff after FORGIVE_STREAK
drafting steps in a row (text that turned repetitive drafts again within min_backoff tokens next time).
"""
from __future__ import annotations

from collections.abc import Iterable

from nv_engine.spec_decode.draft_acceptance import DraftAcceptance

LEVELS = 64           # the acceptance estimate's resolution in the table of best draft lengths
FORGIVE_STREAK = 4    # drafting steps in a row after which the backoff starts from min_backoff again


class DraftLengthPolicy:
    def __init__(self, num_speculative_tokens: int, *, verify_cost: float = 2.0, draft_token_cost: float = 0.05,
                 decay: float = 0.8, prior_acceptance: float = 0.8, prior_weight: float = 2.0,
                 min_backoff: int = 8, max_backoff: int = 128) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"DraftLengthPolicy needs num_speculative_tokens >= 1, got {num_speculative_tokens}")
        if verify_cost < 1.0 or draft_token_cost < 0.0:
            raise ValueError(f"DraftLengthPolicy needs verify_cost >= 1 and draft_token_cost >= 0, got "
                             f"{verify_cost} and {draft_token_cost}")
        if not 0.0 <= decay < 1.0 or not 0.0 <= prior_acceptance <= 1.0 or prior_weight <= 0.0:
            raise ValueError(f"DraftLengthPolicy needs 0 <= decay < 1, 0 <= prior_acceptance <= 1 and "
                             f"prior_weight > 0, got {decay}, {prior_acceptance}, {prior_weight}")
        if not 1 <= min_backoff <= max_backoff:
            raise ValueError(f"DraftLengthPolicy needs 1 <= min_backoff <= max_backoff, got {min_backoff}, "
                             f"{max_backoff}")
        self.num_speculative_tokens = num_speculative_tokens
        self.verify_cost = verify_cost
        self.draft_token_cost = draft_token_cost
        self.decay = decay
        self.prior_accepted = prior_acceptance * prior_weight
        self.prior_tested = prior_weight
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        # [LEVELS + 1]: entry i is the best draft length at acceptance i / LEVELS
        self.lengths = [self.best_length(i / LEVELS) for i in range(LEVELS + 1)]
        # the batch rule's E(k) - 1 per level at that level's length, and a new sequence's (K drafts at the prior)
        self.extra_tokens = [self.expected_tokens(i / LEVELS, self.lengths[i]) - 1.0 for i in range(LEVELS + 1)]
        self.prior_extra_tokens = self.expected_tokens(prior_acceptance, num_speculative_tokens) - 1.0

    @staticmethod
    def expected_tokens(acceptance: float, length: int) -> float:
        """E(k) = 1 + a + ... + a^k: the tokens a step with k drafts emits at per-token acceptance a."""
        if acceptance >= 1.0:
            return length + 1.0
        return (1.0 - acceptance ** (length + 1)) / (1.0 - acceptance)

    def best_length(self, acceptance: float) -> int:
        """argmax over k in 0..K of E(k) / C(k) at per-token acceptance `acceptance` (the docstring's rule; the
        shortest k on ties)."""
        best, best_rate = 0, 1.0                       # k = 0: one token per plain step
        tokens, term = 1.0, 1.0                        # E(k), a^k
        for k in range(1, self.num_speculative_tokens + 1):
            term *= acceptance
            tokens += term
            rate = tokens / (self.verify_cost + self.draft_token_cost * k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def draft_length(self, state: DraftAcceptance, num_tokens: int) -> int:
        """How many drafts the sequence (holding num_tokens tokens, state its acceptance) proposes this step."""
        resume_at = state.resume_at
        if resume_at >= 0:                             # stopped: a full probe once its backoff has passed
            return self.num_speculative_tokens if num_tokens >= resume_at else 0
        return self.lengths[int(state.accepted / state.tested * LEVELS)]

    def drafting(self, state: DraftAcceptance) -> bool:
        """Whether the sequence drafts as its estimate says (not stopped), or is new (its first probe)."""
        return state.resume_at < 0 or state.tested == 0.0

    def due(self, state: DraftAcceptance, num_tokens: int) -> bool:
        """Whether the sequence would propose drafts in a step now (not stopped, or its probe is due)."""
        return state.resume_at < 0 or num_tokens >= state.resume_at

    def asked(self, state: DraftAcceptance) -> None:
        """A drafting step asks the sequence for drafts (its draft length is above 0): one more chance to find some
        (`record` counts the find)."""
        decay = self.decay
        state.asked = decay * state.asked + 1.0
        state.found = decay * state.found

    def expected_step(self, state: DraftAcceptance) -> tuple[float, float]:
        """(tokens, drafts) the sequence expects from a drafting step now (the docstring's batch rule): 1 and 0 while
        stopped (a due probe is a single step's test, not a gain); else 1 + f (E(k) - 1) and f k at its own
        acceptance (the prior for a new sequence, with k = K) and find rate f (1 before any step asked it)."""
        if state.tested == 0.0:
            extra, length = self.prior_extra_tokens, self.num_speculative_tokens
        elif state.resume_at >= 0:
            return 1.0, 0.0
        else:
            level = int(state.accepted / state.tested * LEVELS)
            extra, length = self.extra_tokens[level], self.lengths[level]
        find_rate = min(state.found / state.asked, 1.0) if state.asked > 0.0 else 1.0
        return 1.0 + find_rate * extra, find_rate * length

    def batch_pays(self, expected: Iterable[tuple[float, float]]) -> bool:
        """Whether a drafting step pays for a batch whose sequences expect these (tokens, drafts): more expected tokens
        than B verify_cost + draft_token_cost * (their drafts), the cost of the step in pipelined plain steps of
        the batch, each worth B tokens."""
        tokens = drafts = 0.0
        batch = 0
        for seq_tokens, seq_drafts in expected:
            tokens += seq_tokens
            drafts += seq_drafts
            batch += 1
        return tokens > batch * self.verify_cost + self.draft_token_cost * drafts

    def record(self, state: DraftAcceptance, num_tokens: int, drafted: int, accepted: int) -> None:
        """After a step verified `drafted` >= 1 drafts of the sequence (holding num_tokens tokens before its run)
        and accepted the first `accepted` of them: update the estimate; stop the sequence where k falls to 0."""
        if state.resume_at >= 0:                       # a probe: the evidence starts again from the prior
            state.accepted, state.tested = self.prior_accepted, self.prior_tested
            state.resume_at = -1
            state.streak = 0
        state.found += 1.0                             # asked this step (`asked`), and the proposer found drafts
        decay = self.decay
        state.accepted = decay * state.accepted + accepted
        state.tested = decay * state.tested + accepted + (accepted < drafted)
        if self.lengths[int(state.accepted / state.tested * LEVELS)] == 0:
            backoff = max(state.backoff, self.min_backoff)
            state.resume_at = num_tokens + backoff
            state.backoff = min(2 * backoff, self.max_backoff)
            return
        state.streak += 1
        if state.streak >= FORGIVE_STREAK:
            state.backoff = 0
