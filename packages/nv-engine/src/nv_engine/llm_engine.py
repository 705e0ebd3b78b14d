"""LLMEngine: requests in, RequestOutputs out, one scheduler step per `step()` (vLLM's API).

A step: the Scheduler picks sequences and token counts; a StepBuilder turns them into numpy arrays;
the executor runs the ModelRunner on every rank; the Scheduler appends the sampled ids and applies
token stop rules; the engine then detokenizes, applies stop strings, records logprobs and builds
RequestOutputs. A request with n > 1 is n sequences; the siblings of the first are added once the
first has computed the prompt, so they share its prompt blocks through the prefix cache.

Async scheduling (tensor_parallel_size 1): step N+1 is scheduled and launched before step N's ids
come back. Step N is postprocessed with placeholder ids (lengths and max_tokens apply on time),
the runner takes step N+1's input ids from step N's sampled ids on the device, and while the GPU
runs step N+1 the engine patches in step N's real ids, applies EOS / stop ids and stop strings
(a sequence that stops there computes one extra token, dropped) and builds the outputs. So the
CPU work of a step hides behind the GPU work of the next. Requests with penalties (which need
every output id on the host when sampling) turn it off while they run.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from nv_kvcache import FinishReason, Scheduler, SchedulerOutput, Sequence

from nv_engine.config import EngineConfig
from nv_engine.engine_args import EngineArgs
from nv_engine.detokenizer import IncrementalDetokenizer
from nv_engine.engine_requests import Completion, Request, eos_token_ids, load_tokenizer, prompt_to_ids
from nv_engine.step import PLACEHOLDER_TOKEN, StepResult
from nv_engine.step_builder import StepBuilder
from nv_engine.output_processor import apply_async_tokens, process_samples
from nv_engine.outputs import RequestOutput
from nv_engine.sampling_batch import SamplingBatchBuilder, SamplingRow, sequence_seed
from nv_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Launched:
    """A step handed to the runner: its schedule, sampler inputs, and (synchronous runs) its result."""

    out: SchedulerOutput
    batch: Any
    result: StepResult | None
    tokens: tuple[int, int]          # (prompt tokens computed, tokens sampled)


class LLMEngine:
    """`LLMEngine(config)` or `LLMEngine(model=..., **LLM keyword arguments)`.

    stream_outputs=True: step() returns every request that produced tokens (full text so far).
    stream_outputs=False: only finished requests (text decoded once at the end unless the request
    has stop strings): what LLM.generate uses."""

    def __init__(self, config: EngineConfig | None = None, *, stream_outputs: bool = True,
                 async_scheduling: bool | None = None, **kwargs: Any) -> None:
        if config is None:
            if "model" not in kwargs:
                raise TypeError("LLMEngine needs an EngineConfig or model=...")
            config = EngineArgs.from_kwargs(kwargs.pop("model"), **kwargs).create_engine_config()
        elif kwargs:
            raise TypeError(f"unexpected keyword argument(s) {sorted(kwargs)} next to an EngineConfig")
        from nv_engine.executor import create_executor

        self.config = config
        self.stream_outputs = stream_outputs
        self.tokenizer = load_tokenizer(config)
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.vocab_size = int(config.hf_config.vocab_size)
        self.executor = create_executor(config)
        try:
            self.num_blocks = int(self.executor.determine_num_blocks())
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
        self.rng = random.Random(config.seed)
        self.requests: dict[str, Request] = {}
        self.last_step_tokens = (0, 0)     # (prompt tokens computed, tokens sampled) in the last step
        # None: on when one rank runs the model (other ranks would need the sampled ids too)
        if async_scheduling is None:
            async_scheduling = config.async_scheduling
        self.async_scheduling = (config.tensor_parallel_size == 1 if async_scheduling is None
                                 else bool(async_scheduling))
        self._inflight: _Launched | None = None
        self._num_penalty_requests = 0

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None) -> None:
        """Queue a request. ValueError (engine unchanged) for a bad prompt or parameters."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} is more than max_logprobs={self.config.max_logprobs}")
        prompt_text, ids = prompt_to_ids(prompt, self.tokenizer, self.vocab_size)
        if len(ids) > self.config.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens is longer than max_model_len="
                             f"{self.config.max_model_len}")
        params = params.clone()
        params.prepare_for_model(self.vocab_size, self.tokenizer)
        rules = params.stop_rules(self.eos_token_ids, max_model_len=self.config.max_model_len,
                                  prompt_len=len(ids))
        request = Request(request_id, prompt_text, ids, params, rules)
        self.scheduler.add(self._new_sequence(request))   # may raise ValueError: nothing kept yet
        self.requests[request_id] = request
        self._num_penalty_requests += params.needs_output_token_ids
        if params.n > 1 and not self.config.enable_prefix_caching:
            self.add_siblings(request)                     # nothing to share: batch them at once

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
        completion.stop_ids = request.rules.stopping_ids
        seq = Sequence(request.prompt_token_ids, request.rules, payload=completion)
        completion.seq = seq
        request.completions.append(completion)
        return seq

    def add_siblings(self, request: Request) -> None:
        while len(request.completions) < request.params.n:
            self.scheduler.add(self._new_sequence(request))

    def on_request_finished(self, request: Request) -> None:
        self._num_penalty_requests -= request.params.needs_output_token_ids

    def abort_request(self, request_id: str | list[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their blocks are freed."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            self.on_request_finished(request)
            for completion in request.completions:
                if completion.finish_reason is None:
                    completion.finish_reason = FinishReason.ABORT   # an in-flight step skips it
                if self.scheduler.abort(completion.seq.seq_id) is not None:
                    self.step_builder.release(completion.seq.seq_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; the outputs of the requests that got tokens (stream_outputs) or finished.
        With async scheduling the next step is already running on the device when this returns."""
        launched, self._inflight = self._inflight, None
        if launched is None:
            out = self.scheduler.schedule()
            if out.is_empty:
                if self.scheduler.has_unfinished():
                    raise RuntimeError("the scheduler could not schedule any waiting sequence")
                self.last_step_tokens = (0, 0)
                return []
            launched = self._launch(out, None)
        self.last_step_tokens = launched.tokens
        out = launched.out
        if launched.result is None and self._num_penalty_requests == 0:
            for seq in self.scheduler.postprocess(out, [PLACEHOLDER_TOKEN] * len(out.sampling)):
                self.step_builder.release(seq.seq_id)
            following = self.scheduler.schedule()
            if not following.is_empty:
                self._inflight = self._launch(following, launched)
            result = self.executor.collect()
            apply_async_tokens(self, out.sampling, result.token_ids)
        else:
            result = launched.result if launched.result is not None else self.executor.collect()
            for seq in self.scheduler.postprocess(out, result.token_ids):
                self.step_builder.release(seq.seq_id)
        return process_samples(self, out.sampling, result, launched.batch)

    def _launch(self, out: SchedulerOutput, previous: _Launched | None) -> _Launched:
        """Build the step's inputs and hand it to the runner (launch only, when async)."""
        sampling = out.sampling
        batch = None
        if sampling:
            batch = self.sampling_builder.build([
                SamplingRow(s.seq.payload.request.params, s.seq.payload.seed, s.seq.num_output_tokens,
                            s.seq.prompt_token_ids, s.seq.output_token_ids) for s in sampling])
        prev_index = None
        if previous is not None and previous.out.sampling:
            prev_index = {s.seq.seq_id: j for j, s in enumerate(previous.out.sampling)}
        step_input = self.step_builder.build(out, batch, prev_index)
        num_decodes = len(out.scheduled) if out.is_pure_decode else sum(
            1 for s in out.scheduled if s.num_new_tokens == 1 and s.seq.num_output_tokens > 0)
        launched = _Launched(out, batch, None, (out.num_batched_tokens - num_decodes, len(sampling)))
        if self.async_scheduling:
            self.executor.launch(step_input)
        else:
            launched.result = self.executor.execute(step_input)
        return launched

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
