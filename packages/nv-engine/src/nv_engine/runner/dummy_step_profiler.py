"""DummyStepProfiler: what the largest steps need on the device, measured by running them.

Before the KV cache exists the runner asks how much memory a worst-case step takes: a prefill of
max_num_batched_tokens tokens with its logits and the sampler for max_num_seqs rows (its peak), and
an eager decode of max_num_seqs rows (the activations a captured CUDA graph keeps; one of the largest
mixed-step graph size is added for those graphs' pieces, without the LM head). They run on
dummy inputs with the layers' caches swapped out and put back after (nv_engine.runner.memory does
the arithmetic on the result).
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import torch
from torch import nn

from nv_engine.config.engine_config import EngineConfig
from nv_engine.runner.memory import MemoryProfile, cuda_memory_state, graph_reserve
from nv_engine.runner.mixed_graphs import mixed_graph_sizes
from nv_engine.runner.sampling_tensors import SamplingTensorsSource
from nv_kernels.interface import AttentionBackend
from nv_kernels.kv_layout import allocate_kv_cache
from nv_kernels.parallel_compile import ParallelTritonCompile
from nv_layers.forward_context import ForwardContext, forward_context
from nv_layers.parallel_state import get_tp_size
from nv_layers.sampler import Sampler


class CausalLM(Protocol):
    """What the runner uses of a model class from the registry (an nn.Module)."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...  # [T], [T] -> [T, H]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...  # [S, H] -> [S, V]

    def modules(self) -> Iterator[nn.Module]: ...


class KVCacheLayer(Protocol):
    """An attention layer of the model: the runner assigns its KV cache."""

    k_cache: torch.Tensor  # [NB, BS, Hkv, D]
    v_cache: torch.Tensor  # [NB, BS, Hkv, D]
    num_kv_heads: int
    head_dim: int



class DummyStepProfiler:
    """Runs the worst-case dummy steps of one rank's model and measures their memory (CUDA)."""

    def __init__(self, model: CausalLM, attention_layers: list[KVCacheLayer], backend: AttentionBackend,
                 sampler: Sampler, sampling_tensors: SamplingTensorsSource, config: EngineConfig,
                 device: torch.device) -> None:
        self.model, self.attention_layers, self.backend = model, attention_layers, backend
        self.sampler, self.sampling_tensors = sampler, sampling_tensors
        self.config, self.device = config, device

    def profile(self) -> MemoryProfile:
        """CUDA: peak of a max-size prefill step + sampler, and the activations of a max-size decode."""
        device, config = self.device, self.config
        num_rows = min(self.config.max_num_seqs, config.max_num_batched_tokens)
        self._compile_ahead(num_rows)
        gc.collect()
        total, non_torch = cuda_memory_state(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.dummy_prefill(config.max_num_batched_tokens, num_rows)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        reserve = 0
        if not config.enforce_eager:
            activations = self._activation_bytes(self.config.max_num_seqs, logits=True)
            mixed_sizes = mixed_graph_sizes(config.max_num_batched_tokens) if config.piecewise_graphs else []
            if mixed_sizes:   # the mixed-step graphs' pieces (no LM head) and their static buffers
                activations += self._activation_bytes(mixed_sizes[-1], logits=False)
            reserve = graph_reserve(activations)
        torch.cuda.empty_cache()
        return MemoryProfile(total=total, non_torch=non_torch, peak=peak, graph_reserve=reserve)

    def _compile_ahead(self, num_rows: int) -> None:
        """With an empty Triton cache: compile the kernels of the dummy steps below on a thread pool first (a
        compile-only pass: nothing runs), instead of one after the other as they launch. One rank only: the ranks
        of a tensor-parallel group could decide differently and meet different collectives."""
        config = self.config
        if get_tp_size() > 1:
            return
        passes: list[Callable[[], object]] = [
            lambda: self.dummy_decode(1, logits=False),      # the probe: the cheapest forward
            lambda: self.dummy_prefill(config.max_num_batched_tokens, num_rows, sample=False)]
        if not config.enforce_eager:
            passes.append(lambda: self.dummy_decode(config.max_num_seqs, logits=True))
            mixed_sizes = mixed_graph_sizes(config.max_num_batched_tokens) if config.piecewise_graphs else []
            if mixed_sizes:
                passes.append(lambda: self.dummy_decode(mixed_sizes[-1], logits=False))
        ParallelTritonCompile.ahead(self.device, passes, "the first steps")

    def _activation_bytes(self, num_rows: int, logits: bool) -> int:
        """Memory a decode-shaped dummy step of num_rows rows allocates (CUDA)."""
        device = self.device
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.dummy_decode(num_rows, logits=logits)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base

    def dummy_prefill(self, num_tokens: int, num_rows: int, sample: bool = True) -> None:
        """A prefill of num_tokens tokens (sequences of up to max_model_len) without a KV cache,
        then logits and (sample=True) a worst-case sampler for num_rows rows."""
        seq_len = min(num_tokens, self.config.max_model_len)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        positions = np.concatenate([np.arange(n) for n in lens])
        cu = np.zeros(len(lens) + 1, dtype=np.int32)
        cu[1:] = np.cumsum(lens)
        dev = self.device
        ctx = ForwardContext(
            is_decode=False, slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(len(lens), 1, dtype=torch.int32, device=dev),
            cu_seqlens_q=torch.from_numpy(cu).to(dev), max_seqlen_q=seq_len, max_seqlen_k=seq_len,
            logits_indices=torch.arange(num_rows, dtype=torch.int64, device=dev) % num_tokens,
            backend=self.backend)
        caches = [(layer.k_cache, layer.v_cache) for layer in self.attention_layers]
        for layer in self.attention_layers:          # attention within the batch only, no cache
            layer.k_cache = layer.v_cache = torch.empty(0)
        try:
            with forward_context(ctx):
                hidden = self.model(torch.zeros(num_tokens, dtype=torch.int64, device=dev),
                                    torch.from_numpy(positions).to(dev))
                logits = self.model.compute_logits(hidden)
        finally:
            for layer, (k_cache, v_cache) in zip(self.attention_layers, caches, strict=True):
                layer.k_cache, layer.v_cache = k_cache, v_cache
        del hidden
        if not sample:
            return
        # every rank samples (launch)
        self.sampler(logits, self.sampling_tensors.worst_case(num_rows, logits.shape[1]))

    def dummy_decode(self, batch_size: int, logits: bool = True) -> None:
        """An eager decode of batch_size rows over a one-block scratch KV cache, then (logits=True) logits."""
        bs, dev = self.config.block_size, self.device
        caches = [(layer.k_cache, layer.v_cache) for layer in self.attention_layers]
        for layer in self.attention_layers:   # the real cache's layout: the same kernel variants
            _, layer.k_cache, layer.v_cache = allocate_kv_cache(1, bs, layer.num_kv_heads, layer.head_dim,
                                                                self.config.kv_dtype, dev)
        try:
            ctx = ForwardContext(
                is_decode=True, slot_mapping=torch.full((batch_size,), -1, dtype=torch.int64, device=dev),
                seq_lens=torch.ones(batch_size, dtype=torch.int32, device=dev),
                block_tables=torch.zeros(batch_size, 1, dtype=torch.int32, device=dev),
                cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=1, logits_indices=None,
                backend=self.backend)
            with forward_context(ctx):
                hidden = self.model(torch.zeros(batch_size, dtype=torch.int64, device=dev),
                                    torch.zeros(batch_size, dtype=torch.int64, device=dev))
            if logits:
                self.model.compute_logits(hidden)
        finally:
            for layer, (k_cache, v_cache) in zip(self.attention_layers, caches, strict=True):
                layer.k_cache, layer.v_cache = k_cache, v_cache
