"""How many KV-cache blocks fit: from a memory profile on CUDA, from a byte budget on CPU.

CUDA: the runner measures the peak of a max-size dummy step (a prefill of max_num_batched_tokens
tokens, then logits and the sampler for max_num_seqs rows) and the activation memory of a
max-size decode step (what the captured CUDA graphs will hold in their private pool). The cache
gets what is left of `gpu_memory_utilization * total` after: the peak (weights included), memory
outside PyTorch's allocator (CUDA context, cuBLAS workspaces, other processes), and the graph reserve.
Idea from nano-vllm / vLLM's profile_run + determine_num_available_blocks.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from nv_engine.runner.model_runner import ModelRunner

# CPU KV-cache budget in GiB (like vLLM's VLLM_CPU_KVCACHE_SPACE).
CPU_KV_CACHE_ENV = "NV_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KV_CACHE_GIB = 4.0
GRAPH_RESERVE_FACTOR = 1.25       # graph pools fragment a little more than eager allocation
GRAPH_RESERVE_EXTRA = 128 << 20   # graph executables, per-size workspaces


@dataclass(frozen=True)
class MemoryProfile:
    total: int                # device memory
    non_torch: int            # used outside PyTorch's allocator (context, other processes)
    peak: int                 # peak allocated during the dummy step, weights included
    graph_reserve: int        # set aside for CUDA graph pools (0 when eager)

    def kv_budget(self, gpu_memory_utilization: float) -> int:
        return int(self.total * gpu_memory_utilization) - self.non_torch - self.peak - self.graph_reserve

    def describe(self, gpu_memory_utilization: float) -> str:
        gib = 1 << 30
        return (f"total {self.total / gib:.2f} GiB x {gpu_memory_utilization} - non-torch "
                f"{self.non_torch / gib:.2f} - peak {self.peak / gib:.2f} - graphs "
                f"{self.graph_reserve / gib:.2f} = KV {self.kv_budget(gpu_memory_utilization) / gib:.2f} GiB")


def graph_reserve(decode_activation_bytes: int) -> int:
    return int(decode_activation_bytes * GRAPH_RESERVE_FACTOR) + GRAPH_RESERVE_EXTRA


def cuda_memory_state(device: torch.device) -> tuple[int, int]:
    """(total, memory used outside PyTorch's allocator) after releasing cached blocks."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total, (total - free) - torch.cuda.memory_reserved(device)


def cpu_num_blocks(block_bytes: int, max_num_seqs: int, max_blocks_per_seq: int) -> int:
    """Blocks for every sequence at full length, capped by the CPU budget."""
    try:
        gib = float(os.environ.get(CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_GIB))
    except ValueError:
        raise ValueError(f"{CPU_KV_CACHE_ENV} must be a number of GiB, got "
                         f"{os.environ[CPU_KV_CACHE_ENV]!r}") from None
    budget_blocks = int(gib * (1 << 30)) // block_bytes
    return max(1, min(budget_blocks, max_num_seqs * max_blocks_per_seq))


def profile_memory(runner: "ModelRunner") -> MemoryProfile:
    """Peak of a max-size prefill step + sampler, and the activations of a max-size decode."""
    gc.collect()
    total, non_torch = cuda_memory_state(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    num_rows = min(runner.max_batch, runner.config.max_num_batched_tokens)
    dummy_prefill(runner, runner.config.max_num_batched_tokens, num_rows)
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device)
    reserve = 0
    if not runner.config.enforce_eager:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(runner.device)
        torch.cuda.reset_peak_memory_stats(runner.device)
        dummy_decode(runner, runner.max_batch)
        torch.cuda.synchronize(runner.device)
        reserve = graph_reserve(torch.cuda.max_memory_allocated(runner.device) - base)
    torch.cuda.empty_cache()
    return MemoryProfile(total=total, non_torch=non_torch, peak=peak, graph_reserve=reserve)


def dummy_prefill(runner: "ModelRunner", num_tokens: int, num_rows: int) -> None:
    """A prefill of num_tokens tokens (sequences of up to max_model_len) without a KV cache,
    then logits and a worst-case sampler for num_rows rows."""
    from nv_layers.forward_context import ForwardContext, forward_context

    from nv_engine.runner.input_stager import dummy_sampling_tensors

    seq_len = min(num_tokens, runner.config.max_model_len)
    lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    positions = np.concatenate([np.arange(n) for n in lens])
    cu = np.zeros(len(lens) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(lens)
    dev = runner.device
    ctx = ForwardContext(
        is_decode=False, slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        block_tables=torch.zeros(len(lens), 1, dtype=torch.int32, device=dev),
        cu_seqlens_q=torch.from_numpy(cu).to(dev), max_seqlen_q=seq_len, max_seqlen_k=seq_len,
        logits_indices=torch.arange(num_rows, dtype=torch.int64, device=dev) % num_tokens,
        backend=runner.backend)
    caches = [(layer.k_cache, layer.v_cache) for layer in runner.attention_layers]
    for layer in runner.attention_layers:          # attention within the batch only, no cache
        layer.k_cache = layer.v_cache = torch.empty(0)
    try:
        with forward_context(ctx):
            hidden = runner.model(torch.zeros(num_tokens, dtype=torch.int64, device=dev),
                                  torch.from_numpy(positions).to(dev))
            logits = runner.model.compute_logits(hidden)
    finally:
        for layer, (k_cache, v_cache) in zip(runner.attention_layers, caches):
            layer.k_cache, layer.v_cache = k_cache, v_cache
    del hidden
    if runner.is_driver:
        runner.sampler(logits, dummy_sampling_tensors(num_rows, dev))


def dummy_decode(runner: "ModelRunner", batch_size: int) -> None:
    """An eager decode of batch_size rows over a one-block scratch KV cache, then logits."""
    from nv_layers.forward_context import ForwardContext, forward_context

    bs, dev = runner.config.block_size, runner.device
    caches = [(layer.k_cache, layer.v_cache) for layer in runner.attention_layers]
    for layer in runner.attention_layers:
        shape = (1, bs, layer.num_kv_heads, layer.head_dim)
        layer.k_cache = torch.zeros(shape, dtype=runner.config.dtype, device=dev)
        layer.v_cache = torch.zeros(shape, dtype=runner.config.dtype, device=dev)
    try:
        ctx = ForwardContext(
            is_decode=True, slot_mapping=torch.full((batch_size,), -1, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(batch_size, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(batch_size, 1, dtype=torch.int32, device=dev),
            cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=1, logits_indices=None,
            backend=runner.backend)
        with forward_context(ctx):
            hidden = runner.model(torch.zeros(batch_size, dtype=torch.int64, device=dev),
                                  torch.zeros(batch_size, dtype=torch.int64, device=dev))
        runner.model.compute_logits(hidden)
    finally:
        for layer, (k_cache, v_cache) in zip(runner.attention_layers, caches):
            layer.k_cache, layer.v_cache = k_cache, v_cache
