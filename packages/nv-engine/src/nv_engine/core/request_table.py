"""RequestTable: the engine core's unfinished requests, and what the frontend has been told of them."""
from __future__ import annotations

import random
import time
from collections.abc import Iterator

from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.core.sampling_batch import sequence_seed, unpack_results
from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.core.step import SamplingBatch, StepResult
from nv_engine.spec_decode.speculative_decoding import SpeculativeDecoding
from nv_engine.structured_output.manager import StructuredOutputManager
from nv_kvcache import ScheduledSeq, Scheduler, SchedulerOutput, SequenceStatus

_FINISHED = SequenceStatus.FINISHED


class RequestTable:
    """Request id -> its sequences so far. A request with n > 1 is n sequences: completions 1..n-1
    join the scheduler once the first computed the prompt (they share its blocks through the prefix
    cache), or at once when nothing is shared. A request is forgotten once every completion's final
    update was reported, or when it is aborted.

    It also counts the unfinished requests that change how steps run (penalties need every output
    id on the host; prompt logprobs need prompt rows) and notes when each request is first
    scheduled (`note_first_scheduled`, for EngineCoreOutputs.first_scheduled)."""

    def __init__(self, scheduler: Scheduler, structured_outputs: StructuredOutputManager,
                 eos_token_ids: frozenset[int], max_model_len: int, seed: int) -> None:
        self.scheduler = scheduler
        self.structured_outputs = structured_outputs
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.rng = random.Random(seed)            # seeds of the sequences of requests without one
        self._sequences: dict[str, list[EngineSequence]] = {}
        self._reports_every_token: dict[str, bool] = {}      # id -> the request's rule
        self.num_penalty_requests = 0
        self.num_prompt_logprobs_requests = 0
        self.num_multi_completion_requests = 0       # n > 1
        self.num_unverifiable_requests = 0           # speculative decoding: requests that keep drafting off
        self.first_scheduled: dict[str, float] = {}   # first scheduled since the last take_first_scheduled
        self._scheduled_once: set[str] = set()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._sequences

    def __iter__(self) -> Iterator[str]:
        return iter(self._sequences)

    def __len__(self) -> int:
        return len(self._sequences)

    def __getitem__(self, request_id: str) -> list[EngineSequence]:
        return self._sequences[request_id]

    def get(self, request_id: str) -> list[EngineSequence] | None:
        return self._sequences.get(request_id)

    # ---- requests in and out -------------------------------------------------------------------
    def first_sequence(self, request: EngineCoreRequest) -> EngineSequence:
        """Completion 0 of a new request, not added anywhere yet; ValueError for an id in use."""
        if request.request_id in self._sequences:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.params
        rules = params.stop_rules(self.eos_token_ids, max_model_len=self.max_model_len,
                                  prompt_len=len(request.prompt_token_ids))
        # The first of n > 1 reports its first token: its siblings are added then.
        return EngineSequence(request.prompt_token_ids, rules, request_id=request.request_id, index=0,
                              params=params, seed=sequence_seed(params.seed, 0, self.rng),
                              reports_each_token=request.reports_every_token or params.n > 1)

    def add(self, request: EngineCoreRequest, first: EngineSequence) -> None:
        """Keep a request whose first sequence the scheduler (or the structured-output manager) took."""
        params = request.params
        self._sequences[request.request_id] = [first]
        self._reports_every_token[request.request_id] = request.reports_every_token
        self.num_penalty_requests += params.needs_output_token_ids
        self.num_prompt_logprobs_requests += params.prompt_logprobs is not None
        self.num_multi_completion_requests += params.n > 1
        self.num_unverifiable_requests += not SpeculativeDecoding.verifiable(params)

    def add_siblings(self, request_id: str) -> None:
        """Add the request's completions 1..n-1 to the scheduler."""
        seqs = self._sequences[request_id]
        first = seqs[0]
        params = first.params
        reports = self._reports_every_token[request_id]
        while len(seqs) < params.n:
            seq = EngineSequence(first.prompt_token_ids, first.rules, request_id=request_id, index=len(seqs),
                                 params=params, seed=sequence_seed(params.seed, len(seqs), self.rng),
                                 reports_each_token=reports)
            self.scheduler.add(seq)
            seqs.append(seq)
        first.reports_each_token = reports

    def forget(self, request_id: str) -> list[EngineSequence] | None:
        """Drop a request (and its structured-output state); its sequences, or None if unknown."""
        seqs = self._sequences.pop(request_id, None)
        if seqs is None:
            return None
        params = seqs[0].params
        del self._reports_every_token[request_id]
        self._scheduled_once.discard(request_id)
        self.num_penalty_requests -= params.needs_output_token_ids
        self.num_prompt_logprobs_requests -= params.prompt_logprobs is not None
        self.num_multi_completion_requests -= params.n > 1
        self.num_unverifiable_requests -= not SpeculativeDecoding.verifiable(params)
        self.structured_outputs.remove_request(request_id, [seq.seq_id for seq in seqs])
        return seqs

    def reported_finished(self, seq: EngineSequence) -> None:
        """The frontend knows seq finished; the request is done once all its n are."""
        seq.reported_finished = True
        seqs = self._sequences[seq.request_id]
        if len(seqs) == seq.params.n and all(s.reported_finished for s in seqs):
            self.forget(seq.request_id)

    # ---- per step ------------------------------------------------------------------------------
    def note_first_scheduled(self, out: SchedulerOutput) -> None:
        now = time.monotonic()
        for entry in out.scheduled:
            request_id = entry.seq.request_id   # type: ignore[attr-defined]  # the core adds only these
            if request_id not in self._scheduled_once:
                self._scheduled_once.add(request_id)
                self.first_scheduled[request_id] = now

    def take_first_scheduled(self) -> dict[str, float]:
        first_scheduled, self.first_scheduled = self.first_scheduled, {}
        return first_scheduled

    def report(self, sampling: list[ScheduledSeq], result: StepResult,
               batch: SamplingBatch | None) -> list[SequenceUpdate]:
        """A SequenceUpdate for each of the step's sequences that has news."""
        samples = None
        if batch is not None and batch.flags.get("need_logprobs"):
            samples = unpack_results(result, batch.logprob_counts)
        updates: list[SequenceUpdate] = []
        make_update = tuple.__new__        # SequenceUpdate(*fields) without its Python-level __new__
        # No logprobs, prompt logprobs or siblings to see to in this step: a running sequence's
        # update is its new ids alone (the streamed token of most steps)
        plain = samples is None and not self.num_prompt_logprobs_requests and not self.num_multi_completion_requests
        for i, entry in enumerate(sampling):
            seq: EngineSequence = entry.seq   # type: ignore[assignment]  # the core adds only these
            if seq.reported_finished:
                continue
            finished = seq.status is _FINISHED
            if not finished:
                if not seq.reports_each_token:
                    continue                               # nothing to report this step
                if plain:
                    output = seq.output_token_ids
                    updates.append(make_update(SequenceUpdate, (
                        seq.request_id, seq.index, output[seq.num_reported:], None, 0.0, None, seq.stop_token_id,
                        seq.num_cached_tokens, None)))
                    seq.num_reported = len(output)
                    continue
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
            updates.append(make_update(SequenceUpdate, (
                seq.request_id, seq.index, new_token_ids, logprobs, logprob_delta,
                seq.finish_reason if finished else None, seq.stop_token_id, seq.num_cached_tokens,
                prompt_logprobs)))
            if seq.index == 0 and seq.params.n > 1 and len(self._sequences[seq.request_id]) < seq.params.n:
                self.add_siblings(seq.request_id)          # the prompt's blocks are now cached
            if finished:
                self.reported_finished(seq)
        return updates
