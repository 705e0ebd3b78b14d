"""The runner's step I/O: staging a StepInput into device tensors (graph and eager layouts), the
sampler's tensors, and the asynchronous copy of sampled ids back to the host."""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from nv_engine.step import StepInput, StepResult

if TYPE_CHECKING:
    from nv_engine.runner.model_runner import ModelRunner

_EMPTY = np.zeros(0, dtype=np.int64)


class StagedStep(NamedTuple):
    ctx: Any                              # nv_layers ForwardContext over the staged tensors
    ids: torch.Tensor                     # [T] (or [padded]) input ids
    positions: torch.Tensor
    prev_rows: torch.Tensor | None        # [K] rows of ids to take from the previous step's samples
    prev_src: torch.Tensor | None         # [K] their index in that step's sampled ids


def _stage_prev(i64: Any, step: StepInput | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if step is None or step.prev_rows is None or len(step.prev_rows) == 0:
        return None, None
    return i64.put(step.prev_rows), i64.put(step.prev_src)


def decode_graph_inputs(runner: "ModelRunner", padded: int, step: StepInput | None = None,
                        dummy: bool = False) -> StagedStep:
    """Stage a decode batch padded to `padded` rows in the fixed graph layout:
    int64 [ids | positions | slots], int32 [seq_lens | block_tables (padded x max_blocks)].
    Padding rows have slot -1 and length 0. The previous-step gather indices (if any) follow."""
    from nv_layers.forward_context import ForwardContext

    i64, i32 = runner.i64, runner.i32
    max_blocks = runner.config.max_blocks_per_seq
    i64.begin()
    i32.begin()
    if dummy:  # capture: every row a one-token context in block 0, nothing written to the cache
        ids = i64.put(_EMPTY, padded, fill=0)
        positions = i64.put(_EMPTY, padded, fill=0)
        slots = i64.put(_EMPTY, padded, fill=-1)
        seq_lens = i32.put(_EMPTY, padded, fill=1)
        block_tables = i32.put_rows(np.zeros((padded, max_blocks), dtype=np.int32), padded, max_blocks)
    else:
        ids = i64.put(step.input_ids, padded, fill=0)
        positions = i64.put(step.positions, padded, fill=0)
        slots = i64.put(step.slot_mapping, padded, fill=-1)
        seq_lens = i32.put(step.seq_lens, padded, fill=0)
        block_tables = i32.put_rows(step.block_tables, padded, max_blocks)
    prev_rows, prev_src = _stage_prev(i64, step)
    i64.upload()
    i32.upload()
    ctx = ForwardContext(
        is_decode=True, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables,
        cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=runner.config.max_model_len,
        logits_indices=None, backend=runner.backend)
    return StagedStep(ctx, ids, positions, prev_rows, prev_src)


def eager_inputs(runner: "ModelRunner", step: StepInput) -> StagedStep:
    """Stage any step in a compact layout: int64 [ids | positions | slots | logits indices],
    int32 [seq_lens | cu_seqlens | block_tables (B x M)]."""
    from nv_layers.forward_context import ForwardContext

    i64, i32 = runner.i64, runner.i32
    i64.begin()
    i32.begin()
    ids = i64.put(step.input_ids)
    positions = i64.put(step.positions)
    slots = i64.put(step.slot_mapping)
    logits_indices = None if step.is_decode else i64.put(step.logits_indices)
    seq_lens = i32.put(step.seq_lens)
    cu_seqlens = i32.put(step.cu_seqlens_q)
    batch, cols = step.block_tables.shape
    block_tables = i32.put_rows(step.block_tables, batch, cols)
    prev_rows, prev_src = _stage_prev(i64, step)
    i64.upload()
    i32.upload()
    ctx = ForwardContext(
        is_decode=step.is_decode, slot_mapping=slots, seq_lens=seq_lens, block_tables=block_tables,
        cu_seqlens_q=None if step.is_decode else cu_seqlens, max_seqlen_q=step.max_seqlen_q,
        max_seqlen_k=step.max_seqlen_k, logits_indices=logits_indices, backend=runner.backend)
    return StagedStep(ctx, ids, positions, prev_rows, prev_src)


def greedy_sampling_tensors(num_rows: int, device: torch.device) -> Any:
    from nv_layers.sampler import SamplingTensors

    zeros = torch.zeros(num_rows, device=device)
    return SamplingTensors(
        temperatures=zeros, top_k=torch.zeros(num_rows, dtype=torch.int32, device=device),
        top_p=torch.ones(num_rows, device=device), min_p=zeros,
        seeds=torch.zeros(num_rows, dtype=torch.int64, device=device),
        positions=torch.zeros(num_rows, dtype=torch.int64, device=device),
        all_greedy=True, any_greedy=True, any_top_k=False, any_top_p=False, any_min_p=False)


def dummy_sampling_tensors(num_rows: int, device: torch.device) -> Any:
    """Every sampler stage on (the memory profile's worst case)."""
    from nv_layers.sampler import SamplingTensors

    def full(value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((num_rows,), value, dtype=dtype, device=device)

    return SamplingTensors(
        temperatures=full(0.7), top_k=full(50, torch.int32), top_p=full(0.9), min_p=full(0.05),
        seeds=full(0, torch.int64), positions=full(0, torch.int64), num_logprobs=20,
        need_logprobs=True, presence_penalties=full(0.1), frequency_penalties=full(0.1),
        repetition_penalties=full(1.1),
        output_token_ids=torch.zeros(num_rows, 1, dtype=torch.int64, device=device),
        all_greedy=False, any_greedy=True, any_top_k=True, any_top_p=True, any_min_p=True)


def sampling_tensors(runner: "ModelRunner", sampling: Any, num_rows: int) -> Any:
    """The sampler's tensors for this step: greedy when the step carries no sampling batch."""
    if sampling is None:
        return greedy_sampling_tensors(num_rows, runner.device)
    if hasattr(sampling, "static_id"):  # nv_engine.sampling_batch.SamplingBatch
        return runner.sampling_cache.get(sampling)
    return sampling  # already SamplingTensors


class ResultCopier:
    """Copies sampled ids into pinned host memory without blocking; `finish` waits on an event.
    Launched steps are collected first in, first out (an engine may launch N+1 before collecting N)."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.host = [torch.zeros(max_rows, dtype=torch.int64, pin_memory=self.on_cuda)
                     for _ in range(2 if self.on_cuda else 1)]
        self.current = 0
        self.pending: deque[tuple[torch.Tensor, Any, Any] | None] = deque()

    def start(self, out: Any) -> None:
        """out: nv_layers.sampler.SamplerOutput of the step just launched (None: it sampled nothing)."""
        if out is None:
            self.pending.append(None)
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
        self.pending.append((ids, event, out))

    def finish(self) -> StepResult:
        if not self.pending:
            raise RuntimeError("collect() without a launched step")
        entry = self.pending.popleft()
        if entry is None:
            return StepResult(token_ids=[])
        ids, event, out = entry
        if event is not None:
            event.synchronize()
        result = StepResult(token_ids=ids.tolist())
        if out.logprobs is not None:
            result.logprobs = out.logprobs.tolist()
            result.ranks = out.ranks.tolist() if out.ranks is not None else None
            if out.topk_ids is not None:
                result.topk_ids = out.topk_ids.tolist()
                result.topk_logprobs = out.topk_logprobs.tolist()
        return result
