"""LLMEngine: requests in, RequestOutputs out, one scheduler step per `step()` (vLLM's API).

A step: the Scheduler picks sequences and token counts; a StepBuilder turns them into numpy arrays;
the executor runs the ModelRunner on every rank; the Scheduler appends the sampled ids and applies
token stop rules; the engine then detokenizes, applies stop strings, records logprobs and builds
RequestOutputs. A request with n > 1 is n sequences; the siblings of the first are added once the
first has computed the prompt, so they share its prompt blocks through the prefix cache.
"""
from __future__ import annotations

import logging
import random
from typing import Any

from nv_kvcache import FinishReason, Scheduler, Sequence

from nv_engine.config import EngineConfig
from nv_engine.detokenizer import IncrementalDetokenizer, decode_token
from nv_engine.engine_requests import Completion, Request, eos_token_ids, load_tokenizer, prompt_to_ids
from nv_engine.input_batch import StepBuilder
from nv_engine.outputs import RequestOutput
from nv_engine.sampling_batch import SamplingBatchBuilder, SamplingRow, sequence_seed, unpack_results
from nv_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """`LLMEngine(config)` or `LLMEngine(model=..., **LLM keyword arguments)`.

    stream_outputs=True: step() returns every request that produced tokens (full text so far).
    stream_outputs=False: only finished requests (text decoded once at the end unless the request
    has stop strings): what LLM.generate uses."""

    def __init__(self, config: EngineConfig | None = None, *, stream_outputs: bool = True,
                 **kwargs: Any) -> None:
        if config is None:
            if "model" not in kwargs:
                raise TypeError("LLMEngine needs an EngineConfig or model=...")
            config = EngineConfig.create(kwargs.pop("model"), **kwargs)
        elif kwargs:
            raise TypeError(f"unexpected keyword argument(s) {sorted(kwargs)} next to an EngineConfig")
        from nv_engine.executor import Executor

        self.config = config
        self.stream_outputs = stream_outputs
        self.tokenizer = load_tokenizer(config)
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.vocab_size = int(config.hf_config.vocab_size)
        self.executor = Executor.create(config)
        try:
            self.num_blocks = int(self.executor.call("determine_num_blocks"))
            self.executor.call("allocate_kv_cache", self.num_blocks)
            self.executor.call("capture_cudagraphs")
        except BaseException:
            self.executor.shutdown()
            raise
        self.scheduler = Scheduler(
            num_blocks=self.num_blocks, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching)
        self.step_builder = StepBuilder(config.block_size, config.max_blocks_per_seq)
        self.sampling_builder = SamplingBatchBuilder(self.vocab_size, sorted(self.eos_token_ids))
        self.rng = random.Random(config.seed)
        self.requests: dict[str, Request] = {}
        self.last_step_tokens = (0, 0)     # (prompt tokens computed, tokens sampled) in the last step

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None) -> None:
        """Queue a request. ValueError (engine unchanged) for a bad prompt or parameters."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt_text, ids = prompt_to_ids(prompt, self.tokenizer, self.vocab_size)
        if len(ids) > self.config.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens is longer than max_model_len="
                             f"{self.config.max_model_len}")
        params = params.clone()
        rules = params.stop_rules(self.eos_token_ids, max_model_len=self.config.max_model_len,
                                  prompt_len=len(ids))
        request = Request(request_id, prompt_text, ids, params, rules)
        self.scheduler.add(self._new_sequence(request))   # may raise ValueError: nothing kept yet
        self.requests[request_id] = request
        if params.n > 1 and not self.config.enable_prefix_caching:
            self._add_siblings(request)                    # nothing to share: batch them at once

    def _new_sequence(self, request: Request) -> Sequence:
        index = len(request.completions)
        params = request.params
        detok = None
        if self.tokenizer is not None and (self.stream_outputs or params.stop):
            detok = IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, skip_special_tokens=params.skip_special_tokens,
                stop=params.stop, include_stop_str_in_output=params.include_stop_str_in_output,
                min_tokens=params.min_tokens)
        completion = Completion(request, index, sequence_seed(params.seed, index, self.rng), detok,
                                logprobs=[] if params.logprobs is not None else None)
        # Quiet: no text, logprobs, streaming or siblings to handle until it finishes.
        completion.quiet = (detok is None and params.logprobs is None and not self.stream_outputs
                            and (params.n == 1 or index > 0))
        seq = Sequence(request.prompt_token_ids, request.rules, payload=completion)
        completion.seq = seq
        request.completions.append(completion)
        return seq

    def _add_siblings(self, request: Request) -> None:
        while len(request.completions) < request.params.n:
            self.scheduler.add(self._new_sequence(request))

    def abort_request(self, request_id: str | list[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their blocks are freed."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            for completion in request.completions:
                if self.scheduler.abort(completion.seq.seq_id) is not None:
                    self.step_builder.release(completion.seq.seq_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if out.is_empty:
            if self.scheduler.has_unfinished():
                raise RuntimeError("the scheduler could not schedule any waiting sequence")
            self.last_step_tokens = (0, 0)
            return []
        sampling = out.sampling
        batch = None
        if sampling:
            batch = self.sampling_builder.build([
                SamplingRow(s.seq.payload.request.params, s.seq.payload.seed, s.seq.num_output_tokens,
                            s.seq.prompt_token_ids, s.seq.output_token_ids) for s in sampling])
        step_input = self.step_builder.build(out, batch)
        num_decodes = len(out.scheduled) if out.is_pure_decode else sum(
            1 for s in out.scheduled if s.num_new_tokens == 1 and s.seq.num_output_tokens > 0)
        result = self.executor.call("execute", step_input)
        finished = self.scheduler.postprocess(out, result.token_ids)
        for seq in finished:
            self.step_builder.release(seq.seq_id)
        self.last_step_tokens = (out.num_batched_tokens - num_decodes, len(sampling))
        return self._process_samples(sampling, result, batch)

    def _process_samples(self, sampling: list, result: Any, batch: Any) -> list[RequestOutput]:
        samples = None
        if batch is not None and any(c is not None for c in batch.logprob_counts):
            samples = unpack_results(result, batch.logprob_counts)
        touched: dict[str, Request] = {}
        for i, entry in enumerate(sampling):
            seq = entry.seq
            completion: Completion = seq.payload
            if completion.quiet and not seq.is_finished:
                continue                                   # nothing to record or report this step
            request = completion.request
            token_id = result.token_ids[i]
            if samples is not None and completion.logprobs is not None:
                sample = samples[i]
                for tok, logprob in sample.logprobs.items():
                    logprob.decoded_token = decode_token(self.tokenizer, tok) if self.tokenizer else None
                completion.logprobs.append(sample.logprobs)
                completion.cumulative_logprob += sample.logprob
            stopped_by_token = seq.is_finished and seq.finish_reason is FinishReason.STOP
            if completion.detok is not None and completion.detok.update([token_id]) and not stopped_by_token:
                completion.stop_reason = completion.detok.stop_reason
                if not seq.is_finished:
                    self.scheduler.finish(seq.seq_id, FinishReason.STOP)
                    self.step_builder.release(seq.seq_id)
                completion.finish_reason = FinishReason.STOP
            if seq.is_finished and completion.finish_reason is None:
                completion.finish_reason = seq.finish_reason
                if seq.stop_token_id is not None and seq.stop_token_id in request.params.stop_token_ids:
                    completion.stop_reason = seq.stop_token_id
            if completion.index == 0 and len(request.completions) < request.params.n:
                self._add_siblings(request)                # the prompt's blocks are now cached
            touched[request.request_id] = request
        outputs = []
        for request in touched.values():
            finished = request.finished
            if finished:
                self.requests.pop(request.request_id, None)
            if finished or self.stream_outputs:
                outputs.append(request.to_output(self.tokenizer))
        return outputs

    # ---- lifetime ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown()
            self.executor = None

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
