"""EngineCore: the engine minus tokenization and detokenization; one scheduler step per `step()`.

It takes EngineCoreRequests (token ids, prepared SamplingParams) and returns, per step, a SequenceUpdate per
sequence with news. The frontend (LLMEngine in process, AsyncLLM over a process boundary) owns the tokenizer and
the OutputProcessor, which detokenizes, applies stop strings and builds RequestOutputs; a stop string that ends a
running sequence comes back as `finish_requests`.

A step: the Scheduler picks sequences and token counts; a StepBuilder turns them into numpy arrays; the executor
runs the ModelRunner on every rank; the Scheduler appends the sampled ids and applies token stop rules. A request
with n > 1 is n sequences; the siblings of the first are added once the first has computed the prompt, so they
share its prompt blocks through the prefix cache.

Async scheduling (every TP size): step N+1 is scheduled and launched before step N's ids come back. Step N
is postprocessed with placeholder ids (lengths and max_tokens apply on time), the runner takes step N+1's
input ids from step N's sampled ids on the device, and while the GPU runs step N+1 the core patches in step
N's real ids, applies EOS / stop ids and builds the updates (a sequence a stop string ends computes an extra
token or more, dropped). So the CPU work of a step hides behind the GPU work of the next. Requests with
penalties (which need every output id on the host when sampling) turn it off while they run, and so do steps that
draft (speculative decoding, SpeculativeDecoding.pipelines_after): the pipeline drains before such a step,
which is launched right after the previous step's tokens are in, before that step's report.

Structured outputs: a StructuredOutputManager holds such a request until its grammar compiled (in a worker thread),
fills each step's token bitmask and advances the grammars with the sampled tokens; the core's calls into it (and
GrammarSampling) are the lines marked "structured outputs". They keep async scheduling: step N+1's forward is
launched before step N's ids are back, its sampling waits for the bitmask filled after them (GrammarSampling's
docstring). Between the fill's start and that sampling the core reports step N, and the next `_step` postprocesses
step N+1 with placeholders, schedules step N+2 and builds its inputs (`_prepare`): host work that needs no bitmask.
Step N+2 is launched after step N+1 is sampled (its input ids are step N+1's). With the matcher process, step N's
ids are sent to it before step N+1 is launched, so the launch overlaps the accepts and the fill too.

After any exception (KeyboardInterrupt included) inside `step()`, the requests of the steps it had scheduled
are aborted, the scheduled step is forgotten and every launched result is collected and dropped: the next step
starts clean.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.core.launched_step import LaunchedStep
from nv_engine.core.prompt_logprobs_recording import record_prompt_logprobs
from nv_engine.core.request_table import RequestTable
from nv_engine.core.sampling_batch import SamplingBatchBuilder
from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.core.step import PLACEHOLDER_TOKEN, StepInput, StepResult
from nv_engine.core.step_builder import StepBuilder
from nv_engine.core.warmup_steps import WarmupSteps
from nv_engine.engine.engine_requests import load_tokenizer
from nv_engine.spec_decode.speculative_decoding import SpeculativeDecoding
from nv_engine.structured_output.compiler import HFTokenizer
from nv_engine.structured_output.grammar_sampling import GrammarSampling
from nv_engine.structured_output.manager import StructuredOutputManager, matcher_process_wanted
from nv_kvcache import FinishReason, Scheduler, SchedulerOutput

if TYPE_CHECKING:
    from nv_engine.core.kv_events.publisher import KVEventPublisher
    from nv_engine.executor import Executor

logger = logging.getLogger(__name__)


class EngineCore:
    """`EngineCore(config, eos_token_ids)`: starts the executor, sizes and allocates the KV cache, captures CUDA
    graphs. Async scheduling follows config.async_scheduling (None: on; at TP > 1 every rank samples the same ids
    and feeds its own next step). record_timestamps: note when each request is first scheduled
    (EngineCoreOutputs.first_scheduled) and take the scheduler's stats snapshot each step; off in the offline LLM.
    executor: a ready executor to run the steps on (benchmarks of the host side); None: `create_executor(config)`."""

    def __init__(self, config: EngineConfig, eos_token_ids: Iterable[int], *,
                 record_timestamps: bool = False, tokenizer: HFTokenizer | None = None,
                 executor: Executor | None = None) -> None:
        from nv_engine.executor import create_executor

        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = int(config.hf_config.vocab_size)
        self.record_timestamps = record_timestamps
        self.executor: Executor | None = (create_executor(config, timeout_s=config.distributed_timeout_s)
                                          if executor is None else executor)
        try:
            self.num_blocks = int(self.executor.determine_num_blocks())
            config.check_kv_cache_holds_one_sequence(self.num_blocks)
            self.executor.allocate_kv_cache(self.num_blocks)
            self.executor.capture_cudagraphs()
            if config.is_cuda:   # every kernel variant compiles now, not in the first requests
                WarmupSteps.for_engine(config, self.num_blocks, tuple(sorted(self.eos_token_ids))).run(self.executor)
        except BaseException:
            self.executor.shutdown()
            raise
        # KV-cache events (kv_events_config): recorded by the block manager, published after each step
        self.kv_event_publisher: KVEventPublisher | None = None
        if config.kv_events_config is not None and config.kv_events_config.publishes:
            from nv_engine.core.kv_events.publisher import KVEventPublisher

            self.kv_event_publisher = KVEventPublisher(config.kv_events_config)
        spec = self.speculative = (None if config.speculative_config is None else SpeculativeDecoding(
            config.speculative_config, config.block_size, config.max_num_batched_tokens))
        self.scheduler = Scheduler(
            num_blocks=self.num_blocks, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_kv_cache_events=self.kv_event_publisher is not None,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            propose=None if spec is None else spec.proposer.propose,
            draft_length=None if spec is None or spec.adaptive is None else spec.adaptive.draft_length)
        self.step_builder = StepBuilder(config.block_size, config.max_blocks_per_seq, spec and spec.draft_planner)
        self.sampling_builder = SamplingBatchBuilder(self.vocab_size, sorted(self.eos_token_ids))
        # structured outputs: grammars compile off the step; the tokenizer is loaded at the first one
        # unless the frontend shares its own (an in-process LLMEngine)
        self.structured_outputs = StructuredOutputManager(
            (lambda: tokenizer) if tokenizer is not None else (lambda: load_tokenizer(config)),
            self.vocab_size, sorted(self.eos_token_ids),
            pin_memory=config.is_cuda and self.executor is not None and self.executor.shares_host_memory,
            max_rows=config.max_num_seqs)
        # the matchers in a process of their own: as grammar_matcher_process says, else on CUDA with cores to spare
        wanted = matcher_process_wanted(config.grammar_matcher_process, config.is_cuda)
        self.structured_outputs.use_matcher_process = wanted
        self.grammar_sampling = GrammarSampling(self.structured_outputs)
        self.requests = RequestTable(self.scheduler, self.structured_outputs, self.eos_token_ids,
                                     config.max_model_len, config.seed)   # the unfinished ones
        self.last_step_tokens = (0, 0)     # (prompt tokens computed, tokens sampled) in the last step
        # speculative decoding proposes from the last step's real tokens: drafting steps run synchronously
        self.async_scheduling = (spec is None or spec.pipelines) and config.async_scheduling is not False
        self._inflight: LaunchedStep | None = None
        self._open_steps: list[SchedulerOutput] = []   # scheduled, their outputs not yet processed
        self._num_uncollected = 0                      # launched steps whose result is not collected

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request; ValueError (core unchanged) when it can never run."""
        params = request.params
        first = self.requests.first_sequence(request)      # may raise ValueError: nothing kept yet
        if params.structured_outputs is None:
            self.scheduler.add(first)                      # may raise ValueError: nothing kept yet
        else:                                              # structured outputs: held until compiled
            self.structured_outputs.hold(first)            # may raise ValueError: nothing kept yet
        self.requests.add(request, first)
        if params.n > 1 and not self.config.enable_prefix_caching and params.structured_outputs is None:
            self.requests.add_siblings(request.request_id)   # nothing to share: batch them at once

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their blocks are freed."""
        for rid in request_ids:
            seqs = self.requests.forget(rid)               # structured outputs: their state too
            if seqs is None:
                continue
            for seq in seqs:
                seq.reported_finished = True               # a step in flight drops its token
                if self.scheduler.abort(seq.seq_id) is not None:
                    self.step_builder.release(seq.seq_id)

    def finish_requests(self, completions: Iterable[tuple[str, int]]) -> None:
        """Finish (request_id, index) sequences the frontend ended by a stop string (finish reason STOP); unknown
        or already finished ones are ignored."""
        for request_id, index in completions:
            seqs = self.requests.get(request_id)
            if seqs is None or not 0 <= index < len(seqs) or seqs[index].reported_finished:
                continue
            seq = seqs[index]
            if self.scheduler.finish(seq.seq_id, FinishReason.STOP) is not None:
                self.step_builder.release(seq.seq_id)
            self.requests.reported_finished(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def get_num_free_blocks(self) -> int:
        """KV blocks no sequence holds (prefix-cached ones among them): all of them once idle."""
        return int(self.scheduler.block_manager.num_free_blocks)

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[SequenceUpdate]:
        """Run one step; the updates of the sequences with news. With async scheduling (or a speculative decoding
        step launched early) the next step is already running on the device when this returns."""
        try:
            updates = self._step()
        except BaseException:
            self._abandon_open_steps()
            raise
        if self.kv_event_publisher is not None:        # the step's KV-cache events
            self.kv_event_publisher.publish(self.scheduler.take_kv_events())
        return updates

    def step_outputs(self) -> EngineCoreOutputs:
        """`step()` with what the frontend's statistics need (EngineCoreOutputs)."""
        updates = self.step()
        return EngineCoreOutputs(updates, time.monotonic(), self.requests.take_first_scheduled(),
                                 self.scheduler.stats(), tokens=self.last_step_tokens)

    def _step(self) -> list[SequenceUpdate]:
        scheduler, spec = self.scheduler, self.speculative
        launched, self._inflight = self._inflight, None
        failed: list[SequenceUpdate] = []
        if self.structured_outputs.num_held:
            failed = self._release_structured_outputs(wait=launched is None and not scheduler.has_unfinished())
        unverifiable = self.requests.num_unverifiable_requests   # may only fall in this step: drafts stay valid
        if launched is None:
            out = scheduler.schedule() if spec is None else spec.schedule(scheduler, unverifiable)
            if out.is_empty:
                if scheduler.has_unfinished():
                    raise RuntimeError("the scheduler could not schedule any waiting sequence")
                self.last_step_tokens = (0, 0)
                return failed
            self._open_steps = [out]
            launched = self._launch(out, None)
        self.last_step_tokens = launched.tokens
        out = launched.out
        # overlap while async scheduling is on (a step launched before it was switched off is collected here)
        if launched.result is None and self.async_scheduling and self.requests.num_penalty_requests == 0 and (
                spec is None or spec.pipelines_after(out, scheduler.running, unverifiable)):
            for seq in scheduler.postprocess(out, [PLACEHOLDER_TOKEN] * len(out.sampling)):
                self.step_builder.release(seq.seq_id)
            scheduler.spec_max_batch_size = 0      # no drafts from placeholder tokens
            following = scheduler.schedule()
            prepared = None
            if not following.is_empty:
                self._open_steps.append(following)
                prepared = self._prepare(following, launched)
            # structured outputs: the launched step samples once its bitmask is filled; the host work
            # above needs no bitmask, so a fill in the matcher process ran alongside it. The next
            # forward is enqueued after: its input ids are this step's sampled ids.
            self.grammar_sampling.sample(self.live_executor())
            # the matcher process gets this step's ids before the next launch (the longest host work),
            # which then overlaps its accepts and fill; the device waits for that hand-over
            early = self.grammar_sampling.active and self.structured_outputs.use_matcher_process
            if prepared is not None and not early:
                self._inflight = self._enqueue(*prepared)
            result = self._collect()
            for seq in scheduler.resolve_placeholders(out, result.token_ids, PLACEHOLDER_TOKEN):
                self.step_builder.release(seq.seq_id)
            if early:
                self._advance_grammars(out, result)
                if prepared is not None:
                    self._inflight = self._enqueue(*prepared, fill_first=True)
        else:
            early = False
            self.grammar_sampling.sample(self.live_executor())   # structured outputs: a step launched unsampled
            result = launched.result if launched.result is not None else self._collect()
            for seq in (scheduler.postprocess(out, result.token_ids) if self.speculative is None else
                        scheduler.postprocess_runs(out, self.speculative.runs(out, result.token_ids))):
                self.step_builder.release(seq.seq_id)
        if launched.prompt_logprobs is not None:
            record_prompt_logprobs(out, launched.prompt_logprobs, result)
        if self.grammar_sampling.active and not early:   # structured outputs: advance the matchers, then
            self._advance_grammars(out, result)              # fill the next step's mask while it runs
            self.grammar_sampling.start_fill()
        if (spec is not None and self._inflight is None and self.async_scheduling and not self.grammar_sampling.active
                and self.requests.num_penalty_requests == 0):   # all tokens on the host: the next step may draft
            following = spec.schedule(scheduler, unverifiable)
            if not following.is_empty:                          # its forward overlaps the report below
                self._open_steps.append(following)
                self._inflight = self._launch(following, None)
        updates = self.requests.report(out.sampling, result, launched.batch)
        self._open_steps = [self._inflight.out] if self._inflight is not None else []
        return failed + updates if failed else updates

    def _advance_grammars(self, out: SchedulerOutput, result: StepResult) -> None:
        """Structured outputs: the step's sampled ids advance the matchers; the sequences whose grammar
        ended (or rejected a token) finish."""
        for seq in self.grammar_sampling.finish_by_grammar(
                self.scheduler, [s.seq for s in out.sampling], result.token_ids):  # type: ignore[misc]
            self.step_builder.release(seq.seq_id)

    def _release_structured_outputs(self, wait: bool) -> list[SequenceUpdate]:
        """Structured outputs: requests whose grammar compiled join the scheduler; those whose
        compile failed finish (abort) now. wait: block briefly for a compile (nothing else to run)."""
        added, failed = self.grammar_sampling.admit(self.scheduler, wait)
        for seq in added:
            if seq.params.n > 1 and not self.config.enable_prefix_caching:
                self.requests.add_siblings(seq.request_id)
        updates = [SequenceUpdate(seq.request_id, index, [], None, 0.0, FinishReason.ABORT, None, 0)
                   for seq, _ in failed for index in range(seq.params.n)]
        self.abort_requests([seq.request_id for seq, _ in failed])
        return updates

    def _launch(self, out: SchedulerOutput, previous: LaunchedStep | None) -> LaunchedStep:
        """Build the step's inputs and hand it to the runner (launch only, when async)."""
        return self._enqueue(*self._prepare(out, previous))

    def _prepare(self, out: SchedulerOutput, previous: LaunchedStep | None) -> tuple[LaunchedStep, StepInput]:
        """The step's inputs, built on the host: nothing is handed to the runner yet (`_enqueue`)."""
        sampling = out.sampling
        batch = None
        defer_sampling = False
        if sampling:
            # SamplingRow's fields as plain tuples (a NamedTuple per row per step costs more); the
            # token ids only when some request's penalties or bad words read them
            seqs: list[EngineSequence] = [entry.seq for entry in sampling]   # type: ignore[misc]  # the core adds only these
            batch = self.sampling_builder.build([
                (seq.params, seq.seed, len(seq.output_token_ids), seq.prompt_token_ids, seq.output_token_ids)
                for seq in seqs] if self.requests.num_penalty_requests else [
                (seq.params, seq.seed, len(seq.output_token_ids)) for seq in seqs])
            if self.grammar_sampling.active:               # structured outputs: the grammars' masks
                defer_sampling = self.async_scheduling and self.requests.num_penalty_requests == 0
                if not defer_sampling:                     # synchronous steps: fill it now
                    batch.token_bitmask = self.grammar_sampling.bitmask_now([s.seq for s in sampling])  # type: ignore[misc]
        prompt_widths = None
        if self.requests.num_prompt_logprobs_requests:
            prompt_widths = {}
            for entry in out.scheduled:
                seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the core adds only these
                if seq.prompt_logprobs is not None and seq.params.prompt_logprobs is not None:
                    prompt_widths[seq.seq_id] = seq.params.prompt_logprobs
        step_input = self.step_builder.build(out, batch, follows_previous=previous is not None,
                                             prompt_logprobs=prompt_widths)
        step_input.defer_sampling = defer_sampling
        num_decodes = len(out.scheduled) if out.is_pure_decode else sum(
            [s.num_new_tokens == 1 + len(s.seq.spec_token_ids) and bool(s.seq.output_token_ids)
             for s in out.scheduled]) + out.num_draft_tokens
        launched = LaunchedStep(out, batch, None, (out.num_batched_tokens - num_decodes, len(sampling)),
                             step_input.prompt_logprobs)
        if self.record_timestamps and not out.is_pure_decode:
            self.requests.note_first_scheduled(out)
        return launched, step_input

    def _enqueue(self, launched: LaunchedStep, step_input: StepInput, fill_first: bool = False) -> LaunchedStep:
        """Hand a prepared step to the runner: launch only when async (its sampling waits for
        GrammarSampling.sample with defer_sampling), else run it. fill_first: its bitmask starts filling
        before the launch (every earlier token accepted: the matcher process's order)."""
        executor = self.live_executor()
        if self.async_scheduling:
            if step_input.defer_sampling:
                self.grammar_sampling.launched_unsampled([s.seq for s in launched.out.sampling])  # type: ignore[misc]
                if fill_first:
                    self.grammar_sampling.start_fill()
            executor.launch(step_input)
            self._num_uncollected += 1
        else:
            launched.result = executor.execute(step_input)
            if launched.result is None:
                raise RuntimeError("the executor returned no result for a step")
        return launched

    def _collect(self) -> StepResult:
        result = self.live_executor().collect()
        self._num_uncollected -= 1
        if result is None:
            raise RuntimeError("the executor returned no result for a step")
        return result

    def _abandon_open_steps(self) -> None:
        """After a failed step: abort the requests of every step scheduled but not reported (their
        tokens may never come back), forget the scheduled step, and collect and drop every launched
        result, so the next step starts from a consistent scheduler and runner."""
        request_ids = {entry.seq.request_id for out in self._open_steps    # type: ignore[attr-defined]
                       for entry in out.scheduled}
        self._open_steps = []
        self._inflight = None
        self.scheduler.discard_pending()
        self.grammar_sampling.drop(self.executor)        # structured outputs: a step launched unsampled
        while self._num_uncollected > 0 and self.executor is not None:
            self._num_uncollected -= 1
            try:
                self.executor.collect()
            except Exception:          # a broken runner: its next step reports the failure
                logger.exception("dropping the results of a failed step")
                self._num_uncollected = 0
        self.abort_requests(sorted(request_ids))

    def live_executor(self) -> Executor:
        """The executor; RuntimeError once the engine is shut down."""
        if self.executor is None:
            raise RuntimeError("the engine was shut down")
        return self.executor

    # ---- lifetime ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown()
            self.executor = None
        publisher = getattr(self, "kv_event_publisher", None)
        if publisher is not None:
            publisher.shutdown()
            self.kv_event_publisher = None
        structured_outputs = getattr(self, "structured_outputs", None)
        if structured_outputs is not None:
            structured_outputs.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
