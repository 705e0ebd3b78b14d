"""After a step's sampled ids are on the host: token stop rules for asynchronously scheduled steps,
then detokenization, stop strings, logprobs, n > 1 siblings, and the RequestOutputs."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nv_kvcache import FinishReason

from nv_engine.detokenizer import decode_token
from nv_engine.engine_requests import Completion, Request
from nv_engine.step import PLACEHOLDER_TOKEN
from nv_engine.outputs import RequestOutput
from nv_engine.sampling_batch import unpack_results

if TYPE_CHECKING:
    from nv_engine.llm_engine import LLMEngine


def apply_async_tokens(engine: "LLMEngine", sampling: list, token_ids: list[int]) -> None:
    """The step was postprocessed with placeholders (so the next step could be scheduled before its
    ids came back): put the real ids in, and apply the token stop rules the scheduler could not
    (EOS / stop ids, after min_tokens); max_tokens / max_model_len were applied on time."""
    for entry, token_id in zip(sampling, token_ids):
        seq = entry.seq
        if not seq.token_ids or seq.token_ids[-1] != PLACEHOLDER_TOKEN:
            continue                                   # finished or aborted before this step ended
        seq.token_ids[-1] = token_id
        output = seq.output_token_ids
        output[-1] = token_id
        completion: Completion = seq.payload
        if token_id in completion.stop_ids and len(output) >= seq.rules.min_tokens:
            seq.stop_token_id = token_id
            if seq.is_finished:                        # it also reached its length limit now
                seq.finish_reason = FinishReason.STOP
            else:                                      # stops one step late: its next token is dropped
                engine.scheduler.finish(seq.seq_id, FinishReason.STOP)
                engine.step_builder.release(seq.seq_id)


def process_samples(engine: "LLMEngine", sampling: list, result: Any, batch: Any) -> list[RequestOutput]:
    samples = None
    if batch is not None and any(c is not None for c in batch.logprob_counts):
        samples = unpack_results(result, batch.logprob_counts)
    tokenizer = engine.tokenizer
    touched: dict[str, Request] = {}
    for i, entry in enumerate(sampling):
        seq = entry.seq
        completion: Completion = seq.payload
        if completion.quiet and not seq.is_finished:
            continue                                   # nothing to record or report this step
        if completion.finish_reason is not None:
            continue                                   # ended earlier (stopped late, or aborted)
        request = completion.request
        token_id = result.token_ids[i]
        if samples is not None and completion.logprobs is not None:
            sample = samples[i]
            for tok, logprob in sample.logprobs.items():
                logprob.decoded_token = decode_token(tokenizer, tok) if tokenizer is not None else None
            completion.logprobs.append(sample.logprobs)
            completion.cumulative_logprob += sample.logprob
        stopped_by_token = seq.is_finished and seq.finish_reason is FinishReason.STOP
        if completion.detok is not None and completion.detok.update([token_id]) and not stopped_by_token:
            completion.stop_reason = completion.detok.stop_reason
            if not seq.is_finished:
                engine.scheduler.finish(seq.seq_id, FinishReason.STOP)
                engine.step_builder.release(seq.seq_id)
            completion.finish_reason = FinishReason.STOP
        if seq.is_finished and completion.finish_reason is None:
            completion.finish_reason = seq.finish_reason
            if seq.stop_token_id is not None and seq.stop_token_id in request.params.stop_token_ids:
                completion.stop_reason = seq.stop_token_id
        if completion.index == 0 and len(request.completions) < request.params.n:
            engine.add_siblings(request)               # the prompt's blocks are now cached
        touched[request.request_id] = request
    outputs = []
    for request in touched.values():
        finished = request.finished
        if finished:
            engine.requests.pop(request.request_id, None)
            engine.on_request_finished(request)
        if finished or engine.stream_outputs:
            outputs.append(request.to_output(tokenizer))
    return outputs
