"""LLM: the offline API (vLLM's `LLM`): generate / chat over a batch of prompts."""
from __future__ import annotations

import itertools
import time
from typing import Any

from nv_engine.config import EngineConfig
from nv_engine.llm_engine import LLMEngine
from nv_engine.outputs import RequestOutput
from nv_engine.sampling_params import SamplingParams


class LLM:
    """`LLM(model)` loads a model (a local HF directory, a .gguf file or a hub id) and serves
    `generate` / `chat`. Unknown keyword arguments raise TypeError."""

    def __init__(self, model: str, *, tensor_parallel_size: int = 1, dtype: Any = "auto", seed: int = 0,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool = True, enforce_eager: bool = False,
                 block_size: int | None = None, attention_backend: str | None = None,
                 device: str | None = None, num_gpu_blocks_override: int | None = None,
                 tokenizer: str | None = None, async_scheduling: bool | None = None) -> None:
        config = EngineConfig.create(
            model, tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, enforce_eager=enforce_eager,
            block_size=block_size, attention_backend=attention_backend, device=device,
            num_gpu_blocks_override=num_gpu_blocks_override, tokenizer=tokenizer,
            async_scheduling=async_scheduling)
        self.llm_engine = LLMEngine(config, stream_outputs=False)
        self._request_ids = itertools.count()

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
            params = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        engine = self.llm_engine
        ids = [str(next(self._request_ids)) for _ in prompts]
        try:
            for request_id, prompt, p in zip(ids, prompts, params):
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
        bar = _ProgressBar(len(ids)) if use_tqdm and engine.executor.is_driver else None
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
             chat_template: str | None = None) -> list[RequestOutput]:
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
                    chat_template=chat_template)
            except Exception as exc:
                raise ValueError(f"cannot apply the chat template: {exc}") from exc
            ids = tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __enter__(self) -> "LLM":
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
