"""ResultCopier: the asynchronous copy of a step's sampled ids (and logprobs) back to the host."""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import torch

from nv_engine.core.step import PromptLogprobsResult, StepResult
from nv_layers.sampler import SamplerOutput


class _Pending(NamedTuple):
    token_ids: torch.Tensor              # [S] int64: pinned host copy on CUDA, the sampler's own on CPU
    copied: torch.cuda.Event | None      # recorded after the copy was queued (CUDA only)
    out: SamplerOutput                   # logprobs / top-k, copied when the step is collected
    prompt_logprobs: PromptLogprobsResult | None


class ResultCopier:
    """Copies sampled ids into pinned host memory without blocking; `finish` waits on an event.
    Launched steps are collected first in, first out (an engine may launch N+1 before collecting N)."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.host = [torch.zeros(max_rows, dtype=torch.int64, pin_memory=self.on_cuda)
                     for _ in range(2 if self.on_cuda else 1)]
        self.current = 0
        # None / a bare PromptLogprobsResult: a step that sampled nothing
        self.pending: deque[_Pending | PromptLogprobsResult | None] = deque()

    def start(self, out: SamplerOutput | None, prompt_logprobs: PromptLogprobsResult | None = None) -> None:
        """out: the sampler's output of the step just launched (None: it sampled nothing);
        prompt_logprobs: the step's prompt logprobs, already on the host."""
        if out is None:
            self.pending.append(None if prompt_logprobs is None else prompt_logprobs)
            return
        if self.on_cuda and sum(entry is not None for entry in self.pending) >= len(self.host):
            raise RuntimeError(f"more than {len(self.host)} launched steps are not collected")
        ids = out.token_ids
        event = None
        if self.on_cuda:
            self.current = (self.current + 1) % len(self.host)
            if ids.shape[0] > self.host[self.current].shape[0]:
                self.host[self.current] = torch.zeros(ids.shape[0], dtype=torch.int64, pin_memory=True)
            host = self.host[self.current][:ids.shape[0]]
            host.copy_(ids, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            ids = host
        self.pending.append(_Pending(ids, event, out, prompt_logprobs))

    def finish(self) -> StepResult:
        if not self.pending:
            raise RuntimeError("collect() without a launched step")
        entry = self.pending.popleft()
        if entry is None:
            return StepResult(token_ids=[])
        if isinstance(entry, PromptLogprobsResult):
            return StepResult(token_ids=[], prompt_logprobs=entry)
        ids, event, out, prompt_logprobs = entry
        if event is not None:
            event.synchronize()
        result = StepResult(token_ids=ids.tolist(), prompt_logprobs=prompt_logprobs)
        if out.logprobs is not None:
            result.logprobs = out.logprobs.tolist()
            result.ranks = out.ranks.tolist() if out.ranks is not None else None
            if out.topk_ids is not None and out.topk_logprobs is not None:
                result.topk_ids = out.topk_ids.tolist()
                result.topk_logprobs = out.topk_logprobs.tolist()
        return result
