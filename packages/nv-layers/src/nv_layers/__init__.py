"""Tensor-parallel layers, rotary embeddings, the attention layer and the sampler for nv."""
from nv_layers.__about__ import __version__
from nv_layers.activation import SiluAndMul
from nv_layers.attention import Attention
from nv_layers.embedding import ParallelLMHead, VocabParallelEmbedding
from nv_layers.forward_context import ForwardContext, current_forward_context, forward_context, get_forward_context
from nv_layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from nv_layers.loader import load_safetensors
from nv_layers.norm import RMSNorm
from nv_layers.parallel_state import get_tp_group, get_tp_rank, get_tp_size
from nv_layers.rotary import RopeConfig, RotaryEmbedding, get_rope, rope_config_from_hf
from nv_layers.sampler import Sampler, SamplerOutput, SamplingTensors

__all__ = [
    "Attention", "ColumnParallelLinear", "ForwardContext", "MergedColumnParallelLinear", "ParallelLMHead",
    "QKVParallelLinear", "RMSNorm", "ReplicatedLinear", "RopeConfig", "RotaryEmbedding", "RowParallelLinear",
    "Sampler", "SamplerOutput", "SamplingTensors", "SiluAndMul", "VocabParallelEmbedding", "__version__",
    "current_forward_context", "forward_context",
    "get_forward_context", "get_rope", "get_tp_group", "get_tp_rank", "get_tp_size", "load_safetensors",
    "rope_config_from_hf",
]
