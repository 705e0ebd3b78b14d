"""LLM: the offline API (vLLM's `LLM`): generate / chat over a batch of prompts."""
from __future__ import annotations

import itertools
import time
from typing import Any

from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig, SamplingDefaults
from nv_engine.engine.llm_engine import LLMEngine
from nv_engine.engine.outputs import RequestOutput
from nv_engine.sampling_params import SamplingParams


class LLM:
    """`LLM(model, **kwargs)` loads a model (a local HF directory, a .gguf file or a hub id) and serves
    `generate` / `chat`. The keyword arguments are the fields of `nv_engine.config.engine_args.EngineArgs`
    (vLLM's engine arguments: tensor_parallel_size, dtype, max_model_len, gpu_memory_utilization, ...);
    an unknown one raises TypeError listing the accepted ones, an unsupported value ValueError."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        config = EngineArgs.from_kwargs(model, **kwargs).create_engine_config()
        self.llm_engine = LLMEngine(config, stream_outputs=False)
        self._request_ids = itertools.count()
        self._default_sampling_fields: SamplingDefaults | None = None   # read once

    def get_default_sampling_params(self) -> SamplingParams:
        """The SamplingParams a request gets when it passes none: the checkpoint's generation config
        defaults under generation_config="auto" (vLLM's behaviour), else SamplingParams()."""
        if self._default_sampling_fields is None:
            self._default_sampling_fields = self.config.default_sampling_params()
        return SamplingParams(**self._default_sampling_fields)

    @property
    def config(self) -> EngineConfig:
        return self.llm_engine.config

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    # ---- generate ----------------------------------------------------------------------------
    def generate(self, prompts: Any, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 *, use_tqdm: bool = True) -> list[RequestOutput]:
        """Outputs in input order. `prompts`: a prompt or a list of prompts (string, token ids, or
        {"prompt_token_ids": [...]}); `sampling_params`: one for all, or one per prompt."""
        prompts = _as_prompt_list(prompts)
        if sampling_params is None:
            params = [self.get_default_sampling_params()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        engine = self.llm_engine
        ids = [str(next(self._request_ids)) for _ in prompts]
        try:
            for request_id, prompt, p in zip(ids, prompts, params, strict=True):
                engine.add_request(request_id, prompt, p)
        except BaseException:
            engine.abort_request(ids)     # the bad request's batch is withdrawn; the engine stays usable
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        # under torchrun every rank runs this loop; only rank 0 shows progress
        bar = _ProgressBar(len(ids)) if use_tqdm and engine.live_executor().is_driver else None
        try:
            while engine.has_unfinished_requests():
                outputs = engine.step()
                for out in outputs:
                    if out.finished and out.request_id in wanted:
                        done[out.request_id] = out
                if bar is not None:
                    bar.update(sum(out.finished for out in outputs), *engine.last_step_tokens)
        except BaseException:
            engine.abort_request(ids)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [done[i] for i in ids]

    # ---- chat --------------------------------------------------------------------------------
    def chat(self, messages: list, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             *, use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None
             ) -> list[RequestOutput]:
        """`messages`: one conversation (a list of {"role", "content"} dicts) or a list of them;
        each is rendered with the tokenizer's chat template and generated like a prompt."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conversation in conversations:
            try:
                text = tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                    chat_template=chat_template, **(chat_template_kwargs or {}))
            except Exception as exc:
                raise ValueError(f"cannot apply the chat template: {exc}") from exc
            ids = tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _as_prompt_list(prompts: Any) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and not isinstance(prompts[0], (str, dict, list, tuple)) and hasattr(prompts[0], "__index__"):
        return [prompts]          # one prompt given as a flat list of token ids
    return prompts


class _ProgressBar:
    """tqdm over finished requests with prefill and decode throughput (vLLM's postfix)."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
        self.start = time.perf_counter()
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.last_refresh = self.start

    def update(self, finished: int, prompt_tokens: int, output_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        now = time.perf_counter()
        if finished or now - self.last_refresh > 0.5:
            elapsed = max(now - self.start, 1e-9)
            self.bar.set_postfix_str(f"prefill {self.prompt_tokens / elapsed:.0f} tok/s, "
                                     f"decode {self.output_tokens / elapsed:.0f} tok/s", refresh=False)
            self.bar.update(finished)
            self.bar.refresh()
            self.last_refresh = now

    def close(self) -> None:
        self.bar.close()
