"""LLMEngine: requests in, RequestOutputs out, one scheduler step per `step()` (vLLM's API).

A step: the Scheduler picks sequences and token counts; a StepBuilder turns them into numpy arrays;
the executor runs the ModelRunner on every rank; the Scheduler appends the sampled ids and applies
token stop rules; the engine sends a SequenceUpdate per sequence with news to its OutputProcessor,
which detokenizes, applies stop strings, records logprobs and builds the RequestOutputs (and names
the sequences a stop string ended, which the engine then finishes in the scheduler). A request with
n > 1 is n sequences; the siblings of the first are added once the first has computed the prompt,
so they share its prompt blocks through the prefix cache.

Async scheduling (tensor_parallel_size 1): step N+1 is scheduled and launched before step N's ids
come back. Step N is postprocessed with placeholder ids (lengths and max_tokens apply on time),
the runner takes step N+1's input ids from step N's sampled ids on the device, and while the GPU
runs step N+1 the engine patches in step N's real ids, applies EOS / stop ids and stop strings
(a sequence that stops there computes one extra token, dropped) and builds the outputs. So the
CPU work of a step hides behind the GPU work of the next. Requests with penalties or structured
outputs (which need every output id on the host when sampling) turn it off while they run.

Structured outputs: a StructuredOutputManager holds such a request until its grammar compiled (in a
worker thread), fills each step's token bitmask and advances the grammars with the sampled tokens;
the engine's calls into it are the lines marked "structured outputs".

After any exception (KeyboardInterrupt included) inside `step()`, the requests of the steps it had
scheduled are aborted, the scheduled step is forgotten and every launched result is collected and
dropped, so the next step starts clean.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nv_engine.config import EngineConfig
from nv_engine.engine_args import EngineArgs
from nv_engine.engine_core_output import SequenceUpdate
from nv_engine.engine_requests import Prompt, eos_token_ids, load_tokenizer, prompt_to_ids
from nv_engine.engine_sequence import EngineSequence
from nv_engine.output_processor import OutputProcessor
from nv_engine.outputs import Logprob, RequestOutput, SampleLogprobs
from nv_engine.sampling_batch import SamplingBatchBuilder, SamplingRow, sequence_seed, unpack_results
from nv_engine.sampling_params import SamplingParams
from nv_engine.step import PLACEHOLDER_TOKEN, PromptLogprobsBatch, SamplingBatch, StepResult
from nv_engine.step_builder import StepBuilder
from nv_engine.structured_output.manager import StructuredOutputManager
from nv_kvcache import FinishReason, ScheduledSeq, Scheduler, SchedulerOutput, StopRules

if TYPE_CHECKING:
    from nv_engine.executor import Executor

logger = logging.getLogger(__name__)


@dataclass
class _Launched:
    """A step handed to the runner: its schedule, sampler inputs, and (synchronous runs) its result."""

    out: SchedulerOutput
    batch: SamplingBatch | None
    result: StepResult | None
    tokens: tuple[int, int]          # (prompt tokens computed, tokens sampled)
    prompt_logprobs: PromptLogprobsBatch | None = None


class LLMEngine:
    """`LLMEngine(config)` or `LLMEngine(model=..., **EngineConfig keyword arguments)`.

    stream_outputs=True: step() returns every request that produced tokens (full text so far).
    stream_outputs=False: only finished requests (text decoded once at the end unless the request
    has stop strings): what LLM.generate uses. Async scheduling follows config.async_scheduling
    (None: on when one rank runs the model; the other ranks would need the sampled ids too)."""

    def __init__(self, config: EngineConfig | None = None, *, stream_outputs: bool = True,
                 **kwargs: object) -> None:
        if config is None:
            if "model" not in kwargs:
                raise TypeError("LLMEngine needs an EngineConfig or model=...")
            model = kwargs.pop("model")
            if not isinstance(model, str):
                raise TypeError(f"model must be a string, got {type(model).__name__}")
            config = EngineArgs.from_kwargs(model, **kwargs).create_engine_config()
        elif kwargs:
            raise TypeError(f"unexpected keyword argument(s) {sorted(kwargs)} next to an EngineConfig")
        from nv_engine.executor import create_executor

        self.config = config
        self.tokenizer = load_tokenizer(config)
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.vocab_size = int(config.hf_config.vocab_size)
        self.executor: Executor | None = create_executor(config)
        try:
            self.num_blocks = int(self.executor.determine_num_blocks())
            self._check_kv_cache_holds_one_sequence()
            self.executor.allocate_kv_cache(self.num_blocks)
            self.executor.capture_cudagraphs()
        except BaseException:
            self.executor.shutdown()
            raise
        self.scheduler = Scheduler(
            num_blocks=self.num_blocks, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching)
        self.step_builder = StepBuilder(config.block_size, config.max_blocks_per_seq)
        self.sampling_builder = SamplingBatchBuilder(self.vocab_size, sorted(self.eos_token_ids))
        self.output_processor = OutputProcessor(self.tokenizer, stream_outputs=stream_outputs)
        self.structured_outputs = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                          sorted(self.eos_token_ids))
        self.rng = random.Random(config.seed)
        self.requests: dict[str, list[EngineSequence]] = {}   # unfinished: id -> its sequences so far
        self.last_step_tokens = (0, 0)     # (prompt tokens computed, tokens sampled) in the last step
        self.async_scheduling = (config.tensor_parallel_size == 1 if config.async_scheduling is None
                                 else bool(config.async_scheduling))
        self._inflight: _Launched | None = None
        self._open_steps: list[SchedulerOutput] = []   # scheduled, their outputs not yet processed
        self._num_uncollected = 0                      # launched steps whose result is not collected
        self._num_penalty_requests = 0
        self._num_prompt_logprobs_requests = 0

    def _check_kv_cache_holds_one_sequence(self) -> None:
        config = self.config
        capacity = self.num_blocks * config.block_size
        if capacity < config.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({self.num_blocks} blocks of {config.block_size}), "
                f"fewer than one max_model_len={config.max_model_len} sequence: raise "
                f"gpu_memory_utilization (or num_gpu_blocks_override), or lower max_model_len")

    @property
    def stream_outputs(self) -> bool:
        return self.output_processor.stream_outputs

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None) -> None:
        """Queue a request. ValueError (engine unchanged) for a bad prompt or parameters."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} is more than max_logprobs={self.config.max_logprobs}")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.config.max_logprobs:
            raise ValueError(f"prompt_logprobs={params.prompt_logprobs} is more than "
                             f"max_logprobs={self.config.max_logprobs}")
        prompt_text, ids = prompt_to_ids(prompt, self.tokenizer, self.vocab_size)
        if len(ids) > self.config.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens is longer than max_model_len="
                             f"{self.config.max_model_len}")
        params = params.clone()
        params.prepare_for_model(self.vocab_size, self.tokenizer)
        rules = params.stop_rules(self.eos_token_ids, max_model_len=self.config.max_model_len,
                                  prompt_len=len(ids))
        first = self._new_sequence(request_id, 0, ids, rules, params)
        if params.structured_outputs is None:
            self.scheduler.add(first)                      # may raise ValueError: nothing kept yet
        else:                                              # structured outputs: held until compiled
            self.structured_outputs.hold(first)            # may raise ValueError: nothing kept yet
        self.output_processor.add_request(request_id, prompt_text, ids, params)
        seqs = [first]
        self.requests[request_id] = seqs
        self._num_penalty_requests += params.needs_output_token_ids
        self._num_prompt_logprobs_requests += params.prompt_logprobs is not None
        if params.n > 1 and not self.config.enable_prefix_caching and params.structured_outputs is None:
            self._add_siblings(seqs)                       # nothing to share: batch them at once

    def _new_sequence(self, request_id: str, index: int, prompt_token_ids: list[int], rules: StopRules,
                      params: SamplingParams) -> EngineSequence:
        # The first of n > 1 reports its first token: its siblings are added then.
        reports = self.output_processor.needs_every_token(params) or (index == 0 and params.n > 1)
        return EngineSequence(prompt_token_ids, rules, request_id=request_id, index=index, params=params,
                              seed=sequence_seed(params.seed, index, self.rng), reports_each_token=reports)

    def _add_siblings(self, seqs: list[EngineSequence]) -> None:
        """Add completions 1..n-1 of seqs[0]'s request (after it computed the prompt, they find its
        blocks in the prefix cache)."""
        first = seqs[0]
        params = first.params
        while len(seqs) < params.n:
            seq = self._new_sequence(first.request_id, len(seqs), first.prompt_token_ids, first.rules, params)
            self.scheduler.add(seq)
            seqs.append(seq)
        first.reports_each_token = self.output_processor.needs_every_token(params)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their blocks are freed."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            seqs = self.requests.pop(rid, None)
            if seqs is None:
                continue
            self._num_penalty_requests -= seqs[0].params.needs_output_token_ids
            self._num_prompt_logprobs_requests -= seqs[0].params.prompt_logprobs is not None
            self.structured_outputs.remove_request(rid, [seq.seq_id for seq in seqs])
            for seq in seqs:
                seq.reported_finished = True               # a step in flight drops its token
                if self.scheduler.abort(seq.seq_id) is not None:
                    self.step_builder.release(seq.seq_id)
        self.output_processor.abort_requests(ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; the outputs of the requests that got tokens (stream_outputs) or finished.
        With async scheduling the next step is already running on the device when this returns."""
        try:
            return self._step()
        except BaseException:
            self._abandon_open_steps()
            raise

    def _step(self) -> list[RequestOutput]:
        scheduler = self.scheduler
        launched, self._inflight = self._inflight, None
        failed = self._release_structured_outputs(wait=launched is None and not scheduler.has_unfinished())
        if launched is None:
            out = scheduler.schedule()
            if out.is_empty:
                if scheduler.has_unfinished():
                    raise RuntimeError("the scheduler could not schedule any waiting sequence")
                self.last_step_tokens = (0, 0)
                return failed
            self._open_steps = [out]
            launched = self._launch(out, None)
        self.last_step_tokens = launched.tokens
        out = launched.out
        if launched.result is None and self._num_penalty_requests == 0:
            for seq in scheduler.postprocess(out, [PLACEHOLDER_TOKEN] * len(out.sampling)):
                self.step_builder.release(seq.seq_id)
            following = scheduler.schedule()
            if not following.is_empty:
                self._open_steps.append(following)
                self._inflight = self._launch(following, launched)
            result = self._collect()
            for seq in scheduler.resolve_placeholders(out, result.token_ids, PLACEHOLDER_TOKEN):
                self.step_builder.release(seq.seq_id)
        else:
            result = launched.result if launched.result is not None else self._collect()
            for seq in scheduler.postprocess(out, result.token_ids):
                self.step_builder.release(seq.seq_id)
        if launched.prompt_logprobs is not None:
            self._record_prompt_logprobs(out, launched.prompt_logprobs, result)
        if self.structured_outputs.active:                 # structured outputs: advance the matchers
            for seq, reason in self.structured_outputs.accept([s.seq for s in out.sampling],  # type: ignore[misc]
                                                              result.token_ids):
                if scheduler.finish(seq.seq_id, reason) is not None:
                    self.step_builder.release(seq.seq_id)
        outputs = self._report(out.sampling, result, launched.batch)
        self._open_steps = [self._inflight.out] if self._inflight is not None else []
        return failed + outputs if failed else outputs

    def _release_structured_outputs(self, wait: bool) -> list[RequestOutput]:
        """Structured outputs: requests whose grammar compiled join the scheduler; those whose
        compile failed finish (abort) now. wait: block briefly for a compile (nothing else to run)."""
        released = self.structured_outputs.release(wait=wait)
        failed = list(released.failed)
        for seq in released.ready:
            try:
                self.scheduler.add(seq)
            except ValueError as exc:
                failed.append((seq, str(exc)))
                continue
            if seq.params.n > 1 and not self.config.enable_prefix_caching:
                self._add_siblings(self.requests[seq.request_id])
        if not failed:
            return []
        updates = [SequenceUpdate(seq.request_id, index, [], None, 0.0, FinishReason.ABORT, None, 0)
                   for seq, _ in failed for index in range(seq.params.n)]
        outputs = self.output_processor.process(updates).request_outputs
        self.abort_request([seq.request_id for seq, _ in failed])
        return outputs

    def _launch(self, out: SchedulerOutput, previous: _Launched | None) -> _Launched:
        """Build the step's inputs and hand it to the runner (launch only, when async)."""
        sampling = out.sampling
        batch = None
        if sampling:
            rows = []
            for entry in sampling:
                seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the engine adds only these
                rows.append(SamplingRow(seq.params, seq.seed, seq.num_output_tokens,
                                        seq.prompt_token_ids, seq.output_token_ids))
            batch = self.sampling_builder.build(rows)
            if self.structured_outputs.active:             # structured outputs: the grammars' masks
                batch.token_bitmask = self.structured_outputs.fill_bitmask([s.seq for s in sampling])  # type: ignore[misc]
        prev_index = None
        if previous is not None and previous.out.sampling:
            prev_index = {s.seq.seq_id: j for j, s in enumerate(previous.out.sampling)}
        prompt_widths = None
        if self._num_prompt_logprobs_requests:
            prompt_widths = {}
            for entry in out.scheduled:
                seq = entry.seq   # type: ignore[assignment]
                if seq.prompt_logprobs is not None and seq.params.prompt_logprobs is not None:
                    prompt_widths[seq.seq_id] = seq.params.prompt_logprobs
        step_input = self.step_builder.build(out, batch, prev_index, prompt_widths)
        num_decodes = len(out.scheduled) if out.is_pure_decode else sum(
            1 for s in out.scheduled if s.num_new_tokens == 1 and s.seq.num_output_tokens > 0)
        launched = _Launched(out, batch, None, (out.num_batched_tokens - num_decodes, len(sampling)),
                             step_input.prompt_logprobs)
        executor = self.live_executor()
        if self.async_scheduling:
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

    def _record_prompt_logprobs(self, out: SchedulerOutput, batch: PromptLogprobsBatch,
                                result: StepResult) -> None:
        """Append the step's prompt logprobs to their sequences (a recomputed chunk, after a
        preemption, replaces what it had before)."""
        found = result.prompt_logprobs
        if found is None:
            raise RuntimeError("the runner returned no prompt logprobs for a step that asked for them")
        by_id = {entry.seq.seq_id: entry.seq for entry in out.scheduled}
        row = 0
        for seq_id, count, first in zip(batch.seq_ids, batch.counts, batch.first_positions, strict=True):
            seq: EngineSequence = by_id[seq_id]   # type: ignore[assignment]  # the engine adds only these
            width = seq.params.prompt_logprobs
            entries: list[SampleLogprobs] = []
            for p in range(row, row + count):
                entry = {seq.prompt_token_ids[first + p - row]: Logprob(found.logprobs[p], found.ranks[p])}
                top = zip(found.topk_ids[p][:width], found.topk_logprobs[p][:width], strict=True)
                for rank, (token_id, logprob) in enumerate(top, start=1):
                    entry.setdefault(token_id, Logprob(logprob, rank))
                entries.append(entry)
            row += count
            if seq.prompt_logprobs is not None:
                del seq.prompt_logprobs[first - 1:]
                seq.prompt_logprobs.extend(entries)

    def _report(self, sampling: list[ScheduledSeq], result: StepResult,
                batch: SamplingBatch | None) -> list[RequestOutput]:
        """Tell the output processor about the step's sequences that have news; finish the ones
        it says a stop string ended."""
        samples = None
        if batch is not None and batch.flags.get("need_logprobs"):
            samples = unpack_results(result, batch.logprob_counts)
        updates: list[SequenceUpdate] = []
        for i, entry in enumerate(sampling):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the engine adds only these
            finished = seq.is_finished
            if not (finished or seq.reports_each_token) or seq.reported_finished:
                continue                                   # nothing to report this step
            output = seq.output_token_ids
            new_token_ids = output[seq.num_reported:]
            seq.num_reported = len(output)
            logprobs, logprob_delta = None, 0.0
            if samples is not None and seq.params.logprobs is not None:
                sample = samples[i]
                if sample.logprobs is not None and sample.logprob is not None:
                    logprobs, logprob_delta = [sample.logprobs], sample.logprob
            prompt_logprobs = None
            if seq.prompt_logprobs is not None and seq.num_reported == len(new_token_ids):
                prompt_logprobs = seq.prompt_logprobs          # its first update
            updates.append(SequenceUpdate(
                seq.request_id, seq.index, new_token_ids, logprobs, logprob_delta,
                seq.finish_reason if finished else None, seq.stop_token_id, seq.num_cached_tokens,
                prompt_logprobs))
            if seq.index == 0 and seq.params.n > 1:
                seqs = self.requests[seq.request_id]
                if len(seqs) < seq.params.n:
                    self._add_siblings(seqs)               # the prompt's blocks are now cached
            if finished:
                self._reported_finished(seq)
        processed = self.output_processor.process(updates)
        for request_id, index in processed.to_finish:
            seq = self.requests[request_id][index]
            if self.scheduler.finish(seq.seq_id, FinishReason.STOP) is not None:
                self.step_builder.release(seq.seq_id)
            self._reported_finished(seq)
        return processed.request_outputs

    def _reported_finished(self, seq: EngineSequence) -> None:
        """The processor knows seq finished; the request is done once all its n are."""
        seq.reported_finished = True
        seqs = self.requests[seq.request_id]
        if len(seqs) == seq.params.n and all(s.reported_finished for s in seqs):
            del self.requests[seq.request_id]
            self.structured_outputs.remove_request(seq.request_id, [s.seq_id for s in seqs])
            self._num_penalty_requests -= seq.params.needs_output_token_ids
            self._num_prompt_logprobs_requests -= seq.params.prompt_logprobs is not None

    def _abandon_open_steps(self) -> None:
        """After a failed step: abort the requests of every step scheduled but not reported (their
        tokens may never come back), forget the scheduled step, and collect and drop every launched
        result, so the next step starts from a consistent scheduler and runner."""
        request_ids = {entry.seq.request_id for out in self._open_steps    # type: ignore[attr-defined]
                       for entry in out.scheduled}
        self._open_steps = []
        self._inflight = None
        self.scheduler.discard_pending()
        while self._num_uncollected > 0 and self.executor is not None:
            self._num_uncollected -= 1
            try:
                self.executor.collect()
            except Exception:          # a broken runner: its next step reports the failure
                logger.exception("dropping the results of a failed step")
                self._num_uncollected = 0
        self.abort_request(sorted(request_ids))

    def live_executor(self) -> Executor:
        """The executor; RuntimeError once the engine is shut down."""
        if self.executor is None:
            raise RuntimeError("the engine was shut down")
        return self.executor

    # ---- lifetime ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        structured_outputs = getattr(self, "structured_outputs", None)
        if structured_outputs is not None:
            structured_outputs.shutdown()
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown()
            self.executor = None

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
