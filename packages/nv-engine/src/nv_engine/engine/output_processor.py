"""OutputProcessor: owns the per-request state the user sees (vLLM v1's OutputProcessor is the model).

The engine core sends a SequenceUpdate per sequence it has news of; the processor detokenizes,
applies stop strings, records logprobs and builds the RequestOutputs. It never sees a Sequence, the
scheduler or the engine: a stop string that ends a still-running sequence is handed back in
`ProcessedOutputs.to_finish` for the core to finish. Everything it takes is picklable, so it can
run in a frontend process unchanged.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.engine.byte_level_vocab import ByteLevelVocab
from nv_engine.engine.completion_state import CompletionState
from nv_engine.engine.detokenizer import IncrementalDetokenizer, decode_token
from nv_engine.engine.engine_requests import Tokenizer
from nv_engine.engine.outputs import RequestOutput
from nv_engine.engine.request_state import RequestState
from nv_engine.sampling_params import SamplingParams
from nv_kvcache import FinishReason

_STOP = FinishReason.STOP


class ProcessedOutputs(NamedTuple):
    request_outputs: list[RequestOutput]   # streaming: every request with news; else finished ones
    to_finish: list[tuple[str, int]]       # (request_id, index) sequences a stop string ended


class OutputProcessor:
    """stream_outputs=True: `process` returns every request that got tokens (full text so far), or with
    stream_interval N > 1 only once per N new tokens of each completion (the first tokens and every end at
    once; vLLM's --stream-interval). stream_outputs=False: only finished requests, text decoded once at the
    end unless the request has stop strings."""

    def __init__(self, tokenizer: Tokenizer | None, *, stream_outputs: bool, stream_interval: int = 1) -> None:
        if isinstance(stream_interval, bool) or not isinstance(stream_interval, int) or stream_interval < 1:
            raise ValueError(f"stream_interval must be a positive integer, got {stream_interval!r}")
        self.tokenizer = tokenizer
        self.stream_outputs = stream_outputs
        self.stream_interval = stream_interval
        self.requests: dict[str, RequestState] = {}
        if tokenizer is not None:
            ByteLevelVocab.of(tokenizer)   # the detokenizer's table, built now rather than on the first request

    def needs_every_token(self, params: SamplingParams) -> bool:
        """Whether a request with these parameters needs an update after every step (else only the
        final one, with every token)."""
        return params.needs_every_token(stream=self.stream_outputs, detokenizes=self.tokenizer is not None)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, *, stream: bool = True) -> None:
        """stream=False (only when stream_outputs): this request's caller reads only its finished
        output, so its text is decoded once at the end, as without stream_outputs (its outputs
        before that carry token ids and an empty text)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        streams_text = self.stream_outputs and stream
        tokenizer = self.tokenizer if streams_text or params.stop else None   # None: no detokenizer
        completions = [
            CompletionState(
                index, params.skip_special_tokens,
                IncrementalDetokenizer(
                    tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens,
                    stop=params.stop or (), include_stop_str_in_output=params.include_stop_str_in_output,
                    min_tokens=params.min_tokens) if tokenizer is not None else None,
                logprobs=[] if params.logprobs is not None else None)
            for index in range(params.n)]
        self.requests[request_id] = RequestState(request_id, prompt, prompt_token_ids, params, completions)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Forget these requests (unknown ids are ignored); later updates for them are dropped."""
        for request_id in request_ids:
            self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def process(self, updates: Iterable[SequenceUpdate]) -> ProcessedOutputs:
        tokenizer = self.tokenizer
        requests = self.requests
        touched: dict[str, RequestState] = {}
        to_finish: list[tuple[str, int]] = []
        for update in updates:
            request_id = update.request_id
            state = requests.get(request_id)
            if state is None:
                continue                               # aborted
            completion = state.completions[update.completion_index]
            if completion.finish_reason is not None:
                continue                               # a stop string ended it already
            new_ids = update.new_token_ids
            completion.token_ids.extend(new_ids)
            state.unsent_tokens += len(new_ids)
            if update.completion_index == 0:
                state.num_cached_tokens = update.num_cached_tokens
            if update.prompt_logprobs is not None and state.params.prompt_logprobs is not None:
                if tokenizer is not None:
                    for entry in update.prompt_logprobs:
                        for token_id, logprob in entry.items():
                            logprob.decoded_token = decode_token(tokenizer, token_id)
                state.prompt_logprobs = [None, *update.prompt_logprobs]
            if update.logprobs is not None and completion.logprobs is not None:
                if tokenizer is not None:
                    for sample in update.logprobs:
                        for token_id, logprob in sample.items():
                            logprob.decoded_token = decode_token(tokenizer, token_id)
                completion.logprobs.extend(update.logprobs)
                completion.cumulative_logprob += update.cumulative_logprob_delta
            reason = update.finish_reason
            detokenizer = completion.detokenizer
            # A stop id outranks a stop string completed by the same token.
            if detokenizer is not None and detokenizer.update(new_ids) and reason is not _STOP:
                completion.stop_reason = detokenizer.stop_reason
                completion.finish_reason = _STOP
                if reason is None:
                    to_finish.append((request_id, update.completion_index))
            elif reason is not None:
                completion.finish_reason = reason
                if update.stop_token_id is not None and update.stop_token_id in (state.params.stop_token_ids or ()):
                    completion.stop_reason = update.stop_token_id
            if completion.finish_reason is not None:
                state.completion_finished = True
            touched[request_id] = state
        outputs = []
        interval = self.stream_interval
        for state in touched.values():
            if state.finished:
                del requests[state.request_id]
                outputs.append(state.to_output(tokenizer))
            elif self.stream_outputs and state.output_due(interval):
                outputs.append(state.to_output(tokenizer))
        return ProcessedOutputs(outputs, to_finish)
