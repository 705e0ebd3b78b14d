"""How many KV-cache blocks fit: the arithmetic. From a memory profile on CUDA (DummyStepProfiler.profile
runs the dummy steps), from a byte budget on CPU.

CUDA: the runner measures the peak of a max-size dummy step (a prefill of max_num_batched_tokens
tokens, then logits and the sampler for max_num_seqs rows) and the activation memory of a
max-size decode step (what the captured CUDA graphs will hold in their private pool). The cache
gets what is left of `gpu_memory_utilization * total` after: the peak (weights included), memory
outside PyTorch's allocator (CUDA context, cuBLAS workspaces, other processes), and the graph reserve.
Idea from nano-vllm / vLLM's profile_run + determine_num_available_blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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


def cpu_num_blocks(block_bytes: int, max_num_seqs: int, max_blocks_per_seq: int, gib: float) -> int:
    """Blocks for every sequence at full length, capped by the CPU budget of `gib` GiB
    (EngineConfig.cpu_kv_cache_space_gib)."""
    budget_blocks = int(gib * (1 << 30)) // block_bytes
    return max(1, min(budget_blocks, max_num_seqs * max_blocks_per_seq))
