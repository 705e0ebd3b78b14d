"""LLMEngine: requests in, RequestOutputs out, one scheduler step per `step()` (vLLM's API).

The engine is a tokenizer and an OutputProcessor in front of an in-process EngineCore (which owns
the executor, the scheduler and async scheduling; see core/engine_core.py). `add_request` tokenizes
and checks a request and hands it to the core; `step()` runs one core step and gives its
SequenceUpdates to the OutputProcessor, which detokenizes, applies stop strings, records logprobs
and builds the RequestOutputs; the sequences a stop string ended are then finished in the core.

The offline `LLM` uses this in-process engine: with no process boundary a step costs no
serialization and no wake-up, so it is the fastest path for batch work. `AsyncLLM` runs the same
EngineCore in its own process for the server.

After any exception (KeyboardInterrupt included) inside `step()`, the requests of the steps it had
scheduled are aborted, so the next step starts clean.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core import EngineCore
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.engine.engine_requests import Prompt, eos_token_ids, load_tokenizer
from nv_engine.engine.output_processor import OutputProcessor
from nv_engine.engine.outputs import RequestOutput
from nv_engine.engine.request_preparer import RequestPreparer
from nv_engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nv_engine.core.step_builder import StepBuilder
    from nv_engine.executor import Executor
    from nv_kvcache import Scheduler, SchedulerStats

logger = logging.getLogger(__name__)


class LLMEngine:
    """`LLMEngine(config)` or `LLMEngine(model=..., **EngineConfig keyword arguments)`.

    stream_outputs=True: step() returns every request that produced tokens (full text so far).
    stream_outputs=False: only finished requests (text decoded once at the end unless the request
    has stop strings): what LLM.generate uses. Async scheduling follows config.async_scheduling
    (None: on; at TP > 1 every rank samples the same ids and feeds its own next step)."""

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
        if config.data_parallel_size != 1:
            raise ValueError(f"data_parallel_size={config.data_parallel_size}: an in-process engine is one core; "
                             "AsyncLLM (nv serve) runs several")
        self.config = config
        self.tokenizer = load_tokenizer(config)
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.vocab_size = int(config.hf_config.vocab_size)
        self.core = EngineCore(config, self.eos_token_ids, tokenizer=self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer, stream_outputs=stream_outputs,
                                                stream_interval=config.stream_interval)
        self.preparer = RequestPreparer(config, self.tokenizer)

    # ---- the core's state (tests and benchmarks read it) --------------------------------------
    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def step_builder(self) -> StepBuilder:
        return self.core.step_builder

    @property
    def executor(self) -> Executor | None:
        return self.core.executor

    @property
    def num_blocks(self) -> int:
        return self.core.num_blocks

    @property
    def async_scheduling(self) -> bool:
        return self.core.async_scheduling

    @property
    def last_step_tokens(self) -> tuple[int, int]:
        return self.core.last_step_tokens

    def get_stats(self) -> SchedulerStats:
        """The scheduler's queue lengths, KV usage and cumulative prefix-cache / preemption counters."""
        return self.core.scheduler.stats()

    @property
    def stream_outputs(self) -> bool:
        return self.output_processor.stream_outputs

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None) -> None:
        """Queue a request. ValueError (engine unchanged) for a bad prompt or parameters."""
        core = self.core
        if request_id in core.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt_text, ids, params = self.prepare_request(prompt, params)
        reports = params.needs_every_token(stream=self.stream_outputs, detokenizes=self.tokenizer is not None)
        core.add_request(EngineCoreRequest(request_id, ids, params, reports, time.monotonic()))  # may raise
        self.output_processor.add_request(request_id, prompt_text, ids, params)

    def prepare_request(self, prompt: Prompt, params: SamplingParams | None
                        ) -> tuple[str | None, list[int], SamplingParams]:
        """(prompt text, prompt ids, a prepared copy of params); ValueError for a bad prompt or
        parameters."""
        return self.preparer.prepare(prompt, params)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their blocks are freed."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.core.abort_requests(ids)
        self.output_processor.abort_requests(ids)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.core.get_num_unfinished_requests()

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; the outputs of the requests that got tokens (stream_outputs) or finished.
        With async scheduling the next step is already running on the device when this returns."""
        core = self.core
        try:
            updates = core.step()
        except BaseException:          # the core aborted the step's requests: forget them here too
            self.output_processor.abort_requests(
                [rid for rid in list(self.output_processor.requests) if rid not in core.requests])
            raise
        processed = self.output_processor.process(updates)
        if processed.to_finish:
            core.finish_requests(processed.to_finish)
        return processed.request_outputs

    def live_executor(self) -> Executor:
        """The executor; RuntimeError once the engine is shut down."""
        return self.core.live_executor()

    # ---- lifetime ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        core = getattr(self, "core", None)   # None: __init__ failed before the core started
        if core is not None:
            core.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass

