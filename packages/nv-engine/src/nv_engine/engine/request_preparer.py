"""RequestPreparer: the checks and tokenization a frontend does before a request reaches the core."""
from __future__ import annotations

from nv_engine.config.engine_config import EngineConfig
from nv_engine.engine.engine_requests import Prompt, Tokenizer, prompt_to_ids
from nv_engine.sampling_params import SamplingParams


class RequestPreparer:
    """Turns (prompt, params) into (prompt text, prompt ids, a prepared copy of params), so the
    engine core only sees requests that can run; ValueError for a bad prompt or parameters."""

    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = int(config.hf_config.vocab_size)

    def prepare(self, prompt: Prompt, params: SamplingParams | None
                ) -> tuple[str | None, list[int], SamplingParams]:
        config = self.config
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.logprobs is not None and params.logprobs > config.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} is more than max_logprobs={config.max_logprobs}")
        if params.prompt_logprobs is not None and params.prompt_logprobs > config.max_logprobs:
            raise ValueError(f"prompt_logprobs={params.prompt_logprobs} is more than "
                             f"max_logprobs={config.max_logprobs}")
        prompt_text, ids = prompt_to_ids(prompt, self.tokenizer, self.vocab_size)
        if len(ids) > config.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens is longer than max_model_len={config.max_model_len}")
        params = params.clone()     # later edits by the caller are not seen
        params.prepare_for_model(self.vocab_size, self.tokenizer)
        return prompt_text, ids, params
