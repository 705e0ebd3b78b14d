"""SpeculativeDecoding: the engine core's side of speculative decoding (a SpeculativeConfig in use).

The scheduler asks `propose` for each decode's drafts (only in steps with at most max_batch_size running
sequences); the step verifies them in one forward (several query tokens on top of the cached KV, the chunked-
prefill path: such a step is not a pure decode; up to max_batch_size sequences it replays a verify CUDA graph,
runner.verify_graphs, else it runs eagerly or in a mixed-batch graph); the runner's DraftVerifier emits each
sequence's run, K+1 ids per sequence padded with -1, which `runs` splits for Scheduler.postprocess_runs. Steps
that draft run synchronously (the drafts of step N+1 are proposed from step N's tokens); steps without drafts
(more than max_batch_size running sequences, an unverifiable request, drafting gone quiet: nothing to look up for
a while, or every sequence's drafting stopped by the policy) keep async scheduling where `pipelines`, and the
engine core drains the pipeline when the next step may draft (`pipelines_after`), then schedules it (`schedule`)
and launches it before it reports the step whose tokens it drafts from. With method "draft_model" the scheduler
budgets placeholder drafts and a DraftModelPlanner tells the runner's DraftModelRunner what the draft model
computes in the step (its docstring); without adaptive_draft_length every step is synchronous. A request whose
sampling needs more than temperature / top-k / top-p / min-p (logprobs, penalties, bans, logit bias, allowed ids,
min_tokens, a grammar) turns drafting off for every step while it runs.
With adaptive_draft_length (both methods, with the step costs of POLICY_COSTS), a DraftLengthPolicy caps each
sequence's drafts by its own recent acceptance (the scheduler's `draft_length`; `runs` records each step's
acceptance). While every running sequence has stopped drafting, steps pipeline (with draft_model they run without
the draft model: a pure decode skips it, and it catches up when drafting resumes); the probes that come due then
wait for every PROBE_EVERY-th step, which carries them all (and sequences that probed together come due together
again), so probing costs at most one synchronous step in PROBE_EVERY whatever the batch. A step that is
synchronous anyway carries every probe due. The policy's batch rule weighs the running sequences together (a
drafting step is synchronous for all of them): where it says drafting does not pay, no step drafts and steps
pipeline, but for refresh steps (AdaptiveDrafting) that keep the estimates current. Within a drafting step each
sequence drafts its own length: the draft model's decodes run for the longest one, each for the sequences whose
drafts reach that far.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq

from nv_engine.config.speculative_config import SpeculativeConfig
from nv_engine.sampling_params import SamplingParams
from nv_engine.spec_decode.adaptive_drafting import PROBE_EVERY, AdaptiveDrafting
from nv_engine.spec_decode.draft_length_policy import DraftLengthPolicy
from nv_engine.spec_decode.draft_model_planner import DraftModelPlanner
from nv_engine.spec_decode.ngram_proposer import NgramProposer
from nv_kvcache import Scheduler, SchedulerOutput, Sequence

# The DraftLengthPolicy's step costs per method, in pipelined plain decode steps (its docstring's C(k) = verify_cost
# + draft_token_cost * k): (verify_cost, draft_token_cost).
# ngram: a drafting step is synchronous (about twice a plain step at batch 1); a lookup on the host costs nothing.
# draft_model: the verify step is synchronous too, but a draft model's targets are larger models, whose steps hide
# less host work (1.5); each draft token costs one draft forward (the catch-up for draft 1, a decode for each one
# after it), replaying a graph: about a 0.6B draft's step against an 8B target's at small batch. That is more than
# their parameter ratio (0.07): a small model's step is bound by its kernel launches as much as by its weights.
POLICY_COSTS = {"ngram": (2.0, 0.05), "draft_model": (1.5, 0.25)}
QUIET_STEPS = 4    # steps in a row that could draft but did not, before steps pipeline again


class SpeculativeDecoding:
    """block_size and max_num_batched_tokens: the engine's (a draft model's catch-up forwards are cut to the
    latter)."""

    def __init__(self, config: SpeculativeConfig, block_size: int, max_num_batched_tokens: int) -> None:
        self.config = config
        self.draft_planner: DraftModelPlanner | None = None
        self.proposer: NgramProposer | DraftModelPlanner
        if config.uses_draft_model:
            self.proposer = self.draft_planner = DraftModelPlanner(config.num_speculative_tokens, block_size,
                                                                   max_num_batched_tokens)
        else:
            self.proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                          config.prompt_lookup_max)
        self.quiet_steps = 0       # steps since the last one with drafts, while drafting is allowed
        # per-sequence draft lengths
        self.adaptive: AdaptiveDrafting | None = None
        if config.adaptive_draft_length:
            verify_cost, draft_token_cost = POLICY_COSTS[str(config.method)]
            self.adaptive = AdaptiveDrafting(DraftLengthPolicy(config.num_speculative_tokens, verify_cost=verify_cost,
                                                               draft_token_cost=draft_token_cost))

    @property
    def policy(self) -> DraftLengthPolicy | None:
        """The per-sequence draft-length policy (None: every sequence drafts num_speculative_tokens)."""
        return None if self.adaptive is None else self.adaptive.policy

    @staticmethod
    def verifiable(params: SamplingParams) -> bool:
        """Whether the RejectionSampler can verify drafts of a request with these parameters."""
        return (params.logprobs is None and params.prompt_logprobs is None and not params.needs_output_token_ids
                and params.min_tokens == 0 and params.logit_bias is None and params.allowed_token_ids is None
                and params.structured_outputs is None)

    @property
    def pipelines(self) -> bool:
        """Whether steps without drafts may run pipelined (async scheduling, placeholders for the last step's ids).
        ngram: yes, it proposes on the host from real tokens, in synchronous steps only. draft_model: with
        adaptive_draft_length (a draft that loses is turned off, and the steps without it should pipeline); its
        catch-up in such a step stops before the placeholders (DraftModelPlanner.plan). Without it, no: every step
        of at most max_batch_size sequences drafts, and keeping the others synchronous keeps the draft caught up."""
        return not self.config.uses_draft_model or self.adaptive is not None

    def schedule(self, scheduler: Scheduler, num_unverifiable_requests: int) -> SchedulerOutput:
        """The scheduler's next step with drafts allowed (from real tokens: no placeholder may be pending), unless
        the adaptive policy's batch rule says a drafting step does not pay for the running sequences."""
        limit = self.max_batch_size(num_unverifiable_requests)
        running = scheduler.running
        if 0 < len(running) <= limit and self.adaptive is not None and not self.adaptive.step_may_draft(running):
            limit = 0
        scheduler.spec_max_batch_size = limit
        return scheduler.schedule()

    def pipelines_after(self, launched: SchedulerOutput, running: Seq[Sequence],
                        num_unverifiable_requests: int) -> bool:
        """Whether the step after `launched` (launched, not collected) may be scheduled now from placeholder ids, with
        no drafts: not after a step with drafts (its runs are postprocessed first), nor where drafts_next.
        running: the scheduler's running sequences."""
        if launched.num_draft_tokens:
            return False
        return not self.drafts_next(running, num_unverifiable_requests)

    def drafts_next(self, running: Seq[Sequence], num_unverifiable_requests: int) -> bool:
        """Called once per launched step without drafts (async scheduling): whether the next step should be
        scheduled from real tokens, after the pipeline drained, so that it may draft. Yes while drafting is allowed
        (some running sequence, at most max_batch_size of them, no unverifiable request), some running sequence
        drafts (the policy's: not stopped; or, while every one has stopped, at every PROBE_EVERY-th step where some
        probe is due) and not quiet; quiet: QUIET_STEPS steps in a row that could draft drafted nothing (text the
        proposer finds nothing in), after which steps pipeline and every PROBE_EVERY-th tries again. A step with
        drafts (`runs`) ends the quiet."""
        if not 0 < len(running) <= self.max_batch_size(num_unverifiable_requests):
            self.quiet_steps = 0          # drafting allowed again later: try at once
            return False
        if self.adaptive is not None:
            wanted = self.adaptive.sequences_want_drafts(running)
            if wanted is not None:        # the policy decided: due probes, or the batch rule's refresh
                return wanted
        self.quiet_steps += 1
        return self.quiet_steps <= QUIET_STEPS or self.quiet_steps % PROBE_EVERY == 0

    def max_batch_size(self, num_unverifiable_requests: int) -> int:
        """The scheduler's spec_max_batch_size for the next step (0: no drafts)."""
        return 0 if num_unverifiable_requests else self.config.max_batch_size

    def runs(self, out: SchedulerOutput, token_ids: list[int]) -> list[list[int]]:
        """A verified step's StepResult ids ([S * (K+1)], -1 padded) -> each sampling sequence's emitted run; a step
        without drafts has one id per sequence. Call it before Scheduler.postprocess_runs (which clears the drafts)."""
        if out.num_draft_tokens:
            self.quiet_steps = 0
        num_sequences = len(out.sampling)
        if num_sequences == 0:
            return []
        width = len(token_ids) // num_sequences
        runs = [[t for t in token_ids[i * width:(i + 1) * width] if t >= 0] for i in range(num_sequences)]
        if out.num_draft_tokens:
            if self.draft_planner is not None:
                self.draft_planner.accepted(out, runs)
            if self.adaptive is not None:
                self.adaptive.record(out, runs)
        return runs
