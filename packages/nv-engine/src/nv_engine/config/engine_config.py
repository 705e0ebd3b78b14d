"""EngineConfig: every setting the engine, runner and workers need, resolved once (frozen, picklable)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import torch

from nv_engine.config.kv_events_config import KVEventsConfig
from nv_engine.config.speculative_config import SpeculativeConfig
from nv_kernels.kv_quant import FP8_KV_CACHE_DTYPES

logger = logging.getLogger(__name__)

# The paged-KV block size used when the user gives none. One constant so a measurement can move it.
DEFAULT_BLOCK_SIZE = 64   # measured on the H200: BENCHMARKS.md (headline +14% over 16)
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
# kv_cache_dtype values: "auto" keeps the model dtype; the rest are FP8 (nv_kernels.kv_quant).
KV_CACHE_DTYPES = ("auto", *FP8_KV_CACHE_DTYPES)
# Used only when the checkpoint's config names no context length.
FALLBACK_MAX_MODEL_LEN = 4096
# cuda_graph_mode values (vLLM's CUDAGraphMode names, lower case). "full_and_piecewise": pure-decode steps replay
# one graph of the whole model per padded batch size (at TP 1 with the LM head and a temperature-only draw in a
# second graph), other steps up to 2048 tokens replay the layers' pieces between attentions (runner.mixed_graphs);
# "full_decode_only": the decode graphs only, other steps eager; "none": no graphs (enforce_eager).
CUDA_GRAPH_MODES = ("full_and_piecewise", "full_decode_only", "none")
# fused_ops values: when nv_kernels' fused elementwise kernels run instead of torch ops (nv_kernels.fused_dispatch):
# "auto" on CUDA tensors, "on" also on CPU under TRITON_INTERPRET=1 (tests), "off" never (A/B runs, debugging).
FUSED_OPS_MODES = ("auto", "on", "off")
DEFAULT_CPU_KV_CACHE_GIB = 4.0      # the KV cache's budget on CPU (vLLM's VLLM_CPU_KVCACHE_SPACE)
# Upper bound for one collective (gloo honours it; NCCL's watchdog uses it). A dead worker is normally noticed
# much sooner, through its process sentinel and closed pipe.
DEFAULT_DISTRIBUTED_TIMEOUT_S = 600.0

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
}


class SamplingDefaults(TypedDict, total=False):
    """The checkpoint's sampling defaults (SamplingParams keywords) that a request without its own gets."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    max_tokens: int


@dataclass(frozen=True)
class EngineConfig:
    """Resolved engine settings. Build it with `EngineArgs(model=..., ...).create_engine_config()`
    (nv_engine.config.engine_args), which lists and documents every user-facing argument."""

    model: str                       # resolved local directory (or file, for GGUF)
    hf_config: Any                   # transformers.PretrainedConfig
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1      # engine cores behind one AsyncLLM; core i runs on GPUs i*tp .. (i+1)*tp-1
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    seed: int = 0
    max_model_len: int = FALLBACK_MAX_MODEL_LEN
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_token_threshold: int = 0        # most tokens of one prompt per step; 0: the step's budget
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    cuda_graph_mode: str = "full_and_piecewise"   # CUDA_GRAPH_MODES
    fused_ops: str = "auto"                      # FUSED_OPS_MODES
    attention_backend: str | None = None
    num_gpu_blocks_override: int | None = None   # fixed KV-cache size in blocks (tests, debugging)
    tokenizer: str | None = None                 # tokenizer dir; None = the model dir
    async_scheduling: bool | None = None         # None: on when one rank runs the model
    generation_config: str = "auto"              # "auto" | "vllm" | a folder with generation_config.json
    max_logprobs: int = 20                       # most logprobs a request may ask for
    disable_log_stats: bool = False
    disable_custom_all_reduce: bool = False      # TP: NCCL for every all-reduce
    kv_events_config: KVEventsConfig | None = None   # KV-cache events for routers; None: off
    speculative_config: SpeculativeConfig | None = None   # speculative decoding; None: off
    kv_cache_dtype: str = "auto"                 # "auto" (the model dtype) or an FP8 name (KV_CACHE_DTYPES)
    calculate_kv_scales: bool | None = None      # FP8: True calibrate, False checkpoint or 1.0, None either
    grammar_matcher_process: bool | None = None  # grammar matchers in their own process; None: CUDA and 4+ cores
    cpu_kv_cache_space_gib: float = DEFAULT_CPU_KV_CACHE_GIB   # KV-cache budget when the device is the CPU
    distributed_timeout_s: float = DEFAULT_DISTRIBUTED_TIMEOUT_S   # longest wait of one collective
    quantization: str | None = None              # weights: "fp8" (block-wise), "awq" / "gptq" (INT4) or None
    stream_interval: int = 2                     # streamed outputs: one per this many tokens (first and last at once)

    def validate(self) -> None:
        def positive_int(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("tensor_parallel_size", "data_parallel_size", "max_model_len", "max_num_seqs",
                     "max_num_batched_tokens", "block_size", "stream_interval"):
            positive_int(name)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not (isinstance(self.gpu_memory_utilization, (int, float))
                and 0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        threshold = self.long_prefill_token_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be an integer >= 0 (0: no limit), got {threshold!r}")
        if self.cuda_graph_mode not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph_mode must be one of {', '.join(CUDA_GRAPH_MODES)}, got "
                             f"{self.cuda_graph_mode!r}")
        if self.fused_ops not in FUSED_OPS_MODES:
            raise ValueError(f"fused_ops must be one of {', '.join(FUSED_OPS_MODES)}, got {self.fused_ops!r}")
        for name in ("cpu_kv_cache_space_gib", "distributed_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.num_gpu_blocks_override is not None:
            positive_int("num_gpu_blocks_override")
        if self.data_parallel_size > 1 and ":" in self.device:
            raise ValueError(f"data_parallel_size={self.data_parallel_size} gives each core GPUs of its own "
                             f"in order: use device='cuda' (or CUDA_VISIBLE_DEVICES), not {self.device!r}")
        num_gpus = self.tensor_parallel_size * self.data_parallel_size
        if num_gpus > 1 and self.device.startswith("cuda"):
            available = torch.cuda.device_count()
            if num_gpus > available:
                raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} x data_parallel_size="
                                 f"{self.data_parallel_size} needs {num_gpus} CUDA devices but only "
                                 f"{available} are visible")

    def default_sampling_params(self) -> SamplingDefaults:
        """Sampling defaults for requests that set none (vLLM's `get_diff_sampling_param`): with
        generation_config "auto" the checkpoint's generation_config.json (a folder: its file) values of
        temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens (as max_tokens) that
        differ from transformers' defaults; {} for "vllm" or when there is no such file."""
        if self.generation_config == "vllm":
            return {}
        from transformers import GenerationConfig

        folder = self.model if self.generation_config == "auto" else self.generation_config
        if not (Path(folder) / "generation_config.json").is_file():
            return {}
        try:
            generation = GenerationConfig.from_pretrained(folder).to_diff_dict()
        except Exception as exc:  # malformed file: the user's to fix, named here
            raise ValueError(f"cannot read generation_config.json in {folder!r}: {exc}") from exc
        names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
        return cast(SamplingDefaults, {ours: generation[theirs] for theirs, ours in names.items()
                                       if generation.get(theirs) is not None})

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV cache's element dtype: the model dtype for "auto", else the FP8 dtype."""
        return FP8_KV_CACHE_DTYPES.get(self.kv_cache_dtype, self.dtype)

    @property
    def enforce_eager(self) -> bool:
        """No CUDA graph is captured (cuda_graph_mode "none")."""
        return self.cuda_graph_mode == "none"

    @property
    def piecewise_graphs(self) -> bool:
        """Steps that are not pure decode replay piecewise graphs (cuda_graph_mode "full_and_piecewise")."""
        return self.cuda_graph_mode == "full_and_piecewise"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def check_kv_cache_holds_one_sequence(self, num_blocks: int) -> None:
        """ValueError when a KV cache of num_blocks blocks cannot hold one max_model_len sequence."""
        capacity = num_blocks * self.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({num_blocks} blocks of {self.block_size}), "
                f"fewer than one max_model_len={self.max_model_len} sequence: raise "
                f"gpu_memory_utilization (or num_gpu_blocks_override), or lower max_model_len")


def resolve_device(device: str | torch.device | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available")
    if not (name.startswith("cuda") or name == "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {name!r}")
    return name


def checkpoint_dtype(hf_config: Any) -> torch.dtype | None:
    """The dtype the checkpoint was saved in (`dtype`, or `torch_dtype` on older transformers)."""
    for attr in ("dtype", "torch_dtype"):
        value = getattr(hf_config, attr, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str):
            return _DTYPE_NAMES.get(value.removeprefix("torch."))
    return None


def resolve_dtype(dtype: str | torch.dtype, hf_config: Any, device: str) -> torch.dtype:
    """'auto' = the checkpoint's dtype on GPU (bfloat16 if it names none), float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if not isinstance(dtype, str):
        raise ValueError(f"dtype must be a string or torch.dtype, got {dtype!r}")
    if dtype == "auto":
        if not device.startswith("cuda"):
            return torch.float32
        found = checkpoint_dtype(hf_config)
        return found if found is not None else torch.bfloat16
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPE_NAMES)}, got {dtype!r}")
    return _DTYPE_NAMES[dtype]


def resolve_max_model_len(user_value: int | None, hf_config: Any) -> int:
    """The checkpoint's max_position_embeddings, capped by the user's value."""
    model_max = getattr(hf_config, "max_position_embeddings", None) or FALLBACK_MAX_MODEL_LEN
    if user_value is None:
        return int(model_max)
    if isinstance(user_value, bool) or not isinstance(user_value, int) or user_value < 1:
        raise ValueError(f"max_model_len must be a positive integer, got {user_value!r}")
    if user_value > model_max:
        logger.warning("max_model_len=%d exceeds the model's max_position_embeddings=%d; using %d",
                       user_value, model_max, model_max)
        return int(model_max)
    return user_value
