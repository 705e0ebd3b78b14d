"""EngineArgs: the one list of user-facing engine arguments (vLLM's `EngineArgs`: same names, defaults
and meanings). `LLM(model, **kwargs)` takes them as keywords; `nv generate`, `nv bench` and `nv serve`
get their flags from `EngineArgs.add_cli_arguments`; `create_engine_config()` resolves them into the
frozen `EngineConfig` the engine and workers use.

vLLM arguments that nv does not implement are accepted only at the value that means "off" and refused
otherwise with a ValueError that says why and what to use instead."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nv_engine.config.engine_config import (
    CUDA_GRAPH_MODES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CPU_KV_CACHE_GIB,
    DEFAULT_DISTRIBUTED_TIMEOUT_S,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    FUSED_OPS_MODES,
    KV_CACHE_DTYPES,
    EngineConfig,
    resolve_device,
    resolve_dtype,
    resolve_max_model_len,
)
from nv_engine.config.kv_events_config import KVEventsConfig
from nv_engine.config.quantization import QUANTIZATION_CHOICES, resolve_quantization
from nv_engine.config.speculative_config import SpeculativeConfig
from nv_engine.sampling_params import MAX_LOGPROBS

logger = logging.getLogger(__name__)

DEFAULT_SWAP_SPACE_GIB = 4.0


def _arg(default: Any, help: str, *, type: Any = str, choices: list[str] | None = None,
         aliases: tuple[str, ...] = ()) -> Any:
    """A dataclass field that also describes its command-line flag. type=bool: --x/--no-x."""
    return field(default=default, metadata={"help": help, "type": type, "choices": choices,
                                            "aliases": aliases})


@dataclass
class EngineArgs:
    """Engine arguments as the user gives them (unresolved). See the module docstring."""

    model: str = _arg("", "HF checkpoint directory, .gguf file or hub id")
    # ---- model and tokenizer -----------------------------------------------------------------
    tokenizer: str | None = _arg(None, "tokenizer directory or hub id (default: the model's)")
    tokenizer_mode: str = _arg("auto", "tokenizer implementation; only 'auto' (the HF fast tokenizer when "
                               "there is one)")
    trust_remote_code: bool = _arg(False, "refused when on: nv never runs code from a checkpoint", type=bool)
    revision: str | None = _arg(None, "hub revision (branch, tag or commit) of the model")
    tokenizer_revision: str | None = _arg(None, "hub revision of --tokenizer when it is a hub id")
    download_dir: str | None = _arg(None, "where hub downloads go (default: the Hugging Face cache)")
    hf_token: bool | str | None = _arg(None, "Hugging Face token for hub downloads (default: the stored login)")
    dtype: str | torch.dtype = _arg("auto", "auto (the checkpoint's dtype on GPU, float32 on CPU), float32, "
                                    "bfloat16 or float16")
    quantization: str | None = _arg(None, "weight quantization: 'fp8' (block-wise 128x128 FP8 weights, "
                                    "W8A8; on an unquantized checkpoint: quantized when loaded), 'awq' / 'gptq' "
                                    "(INT4 weights in groups of 128, W4A16, from an AWQ / GPTQ checkpoint; 'awq' on "
                                    "an unquantized checkpoint: round to nearest when loaded) or None (as the "
                                    "checkpoint is; a .gguf model is dequantized when loaded)",
                                    choices=list(QUANTIZATION_CHOICES))
    max_model_len: int | None = _arg(None, "longest prompt + output in tokens (default: the model's "
                                     "context length)", type=int)
    generation_config: str = _arg("auto", "'auto': the checkpoint's generation_config.json gives the "
                                  "defaults of temperature, top_p, top_k, min_p and repetition_penalty, and "
                                  "its max_new_tokens caps every request; 'vllm': library defaults; or a "
                                  "folder holding a generation_config.json")
    max_logprobs: int = _arg(MAX_LOGPROBS, "most logprobs a request may ask for", type=int)
    seed: int = _arg(0, "engine seed (seeds each request that sets no seed of its own)", type=int)
    # ---- devices and parallelism -------------------------------------------------------------
    device: str | None = _arg(None, "cuda, cuda:N or cpu (default: cuda when available)")
    tensor_parallel_size: int = _arg(1, "GPUs the model is split over", type=int, aliases=("-tp",))
    data_parallel_size: int = _arg(1, "engine cores behind one frontend (nv serve), each with its own copy of "
                                   "the model on tensor_parallel_size GPUs of its own", type=int, aliases=("-dp",))
    pipeline_parallel_size: int = _arg(1, "pipeline stages; only 1 (nv splits models by tensor "
                                       "parallelism)", type=int, aliases=("-pp",))
    distributed_executor_backend: str | None = _arg(
        None, "'mp' (or unset): tensor-parallel workers are local processes; 'ray' is not supported")
    disable_custom_all_reduce: bool = _arg(False, "tensor parallelism: reduce every tensor with NCCL, never "
                                           "with the peer-to-peer symmetric-memory all-reduce that small "
                                           "tensors use by default", type=bool)
    distributed_timeout_s: float = _arg(DEFAULT_DISTRIBUTED_TIMEOUT_S, "tensor parallelism: longest wait of one "
                                        "collective, in seconds, before the engine gives up", type=float)
    # ---- memory and KV cache -----------------------------------------------------------------
    gpu_memory_utilization: float = _arg(0.9, "fraction of GPU memory for weights, activations and the KV "
                                         "cache", type=float)
    block_size: int | None = _arg(None, f"tokens per KV-cache block (default {DEFAULT_BLOCK_SIZE})", type=int)
    kv_cache_dtype: str = _arg("auto", "KV-cache dtype: 'auto' (the model dtype), 'fp8' (= 'fp8_e4m3') or "
                               "'fp8_e5m2' (half the bytes: twice the cached tokens, faster decode; scales from "
                               "the checkpoint, else calibrated at start)",
                               choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    calculate_kv_scales: bool | None = _arg(
        None, "FP8 KV cache: on: calibrate the K/V scales at start; off: the checkpoint's k_scale/v_scale, "
        "else 1.0; unset: the checkpoint's, else calibrated", type=bool)
    num_gpu_blocks_override: int | None = _arg(None, "fixed KV-cache size in blocks (tests, debugging)",
                                               type=int)
    cpu_kv_cache_space_gib: float = _arg(DEFAULT_CPU_KV_CACHE_GIB, "KV-cache budget in GiB when the device is "
                                         "the CPU", type=float)
    enable_prefix_caching: bool = _arg(True, "reuse the KV cache of shared prompt prefixes", type=bool)
    swap_space: float = _arg(DEFAULT_SWAP_SPACE_GIB, "accepted and ignored: nv preempts by recomputing, "
                             "not by swapping to CPU memory", type=float)
    cpu_offload_gb: float = _arg(0.0, "only 0: nv keeps all weights on the device", type=float)
    # ---- scheduling --------------------------------------------------------------------------
    max_num_seqs: int | None = _arg(None, f"most sequences in one step (default {DEFAULT_MAX_NUM_SEQS})",
                                    type=int)
    max_num_batched_tokens: int | None = _arg(
        None, f"most tokens in one step (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})", type=int)
    long_prefill_token_threshold: int = _arg(
        0, "most tokens one prompt is given per step (0: no limit but the step's budget). The step budget "
        "(--max-num-batched-tokens) bounds how long a step, and so a streamed token's wait, can be; this bounds "
        "one long prompt's share of it", type=int)
    enable_chunked_prefill: bool | None = _arg(
        None, "nv always splits long prompts over steps; off: the step budget grows to max_model_len so a "
        "prompt never has to be split", type=bool)
    stream_interval: int = _arg(
        2, "a streamed request's news goes out once every this many tokens (its first token and its end at "
        "once); 1: after every token (vLLM's default). 2 halves the server's and the clients' work per token: "
        "at 256 streams, one client process keeps up and tokens arrive without stalls (vLLM's "
        "--stream-interval)", type=int)
    async_scheduling: bool | None = _arg(None, "schedule step N+1 while step N runs (default: on; "
                                         "off only for steps that need every output id on the host)", type=bool)
    # ---- execution ---------------------------------------------------------------------------
    enforce_eager: bool = _arg(False, "no CUDA graphs (the same as --cuda-graph-mode none)", type=bool)
    cuda_graph_mode: str | None = _arg(
        None, "full_and_piecewise (default): pure-decode steps replay a graph of the whole model, other steps up "
        "to 2048 tokens graphs of the layers between attentions; full_decode_only: the decode graphs only; none: "
        "no CUDA graphs", choices=list(CUDA_GRAPH_MODES))
    fused_ops: str = _arg("auto", "fused Triton norm / rotary / activation kernels: auto (on CUDA), on (also on "
                          "CPU under TRITON_INTERPRET=1), off (torch ops)", choices=list(FUSED_OPS_MODES))
    max_seq_len_to_capture: int = _arg(8192, "accepted for compatibility; no effect (nv's CUDA graphs "
                                       "cover every length up to max_model_len)", type=int)
    attention_backend: str | None = _arg(None, "torch, triton or flash_attn (default: the fastest available)")
    disable_log_stats: bool = _arg(False, "no periodic statistics line in nv serve's log "
                                   "(throughput, running / waiting requests, KV usage, prefix-cache hits)", type=bool)
    grammar_matcher_process: bool | None = _arg(
        None, "structured outputs: keep the grammar matchers in a process of their own (default: on CUDA with 4 "
        "or more CPU cores)", type=bool)
    kv_events_config: KVEventsConfig | dict[str, Any] | str | None = _arg(
        None, 'KV-cache events for KV-aware routers, JSON: {"enable_kv_cache_events": true, "publisher": '
        '"zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"} (default: off)', type=json.loads)
    speculative_config: SpeculativeConfig | dict[str, Any] | str | None = _arg(
        None, 'speculative decoding, JSON (the defaults shown): {"method": "ngram", "num_speculative_tokens": 5, '
        '"prompt_lookup_min": 1, "prompt_lookup_max": 4, "max_batch_size": 32, "adaptive_draft_length": true} (no '
        'drafts in steps with more running sequences; each sequence drafts what its own acceptance pays for, at most '
        'num_speculative_tokens), or a draft model with the same vocabulary: {"method": "draft_model", "model": '
        'PATH, "num_speculative_tokens": 5, "draft_sampling": "greedy" or "sampled"} (default: off)',
        type=json.loads)
    # ---- features nv does not have -----------------------------------------------------------
    enable_lora: bool = _arg(False, "only off: nv has no LoRA adapters", type=bool)
    max_lora_rank: int = _arg(16, "accepted for compatibility; no effect (no LoRA)", type=int)

    def __post_init__(self) -> None:
        """Refuse values nv cannot honour now, before any model is read."""
        refusals = {
            "trust_remote_code": (self.trust_remote_code is True,
                                  "nv never runs code from a checkpoint; use a model whose architecture "
                                  "nv supports natively (leave trust_remote_code False)"),
            "tokenizer_mode": (self.tokenizer_mode != "auto",
                               "nv loads tokenizers with transformers' AutoTokenizer; use 'auto'"),
            "quantization": (self.quantization not in (None, *QUANTIZATION_CHOICES),
                             f"nv runs {', '.join(QUANTIZATION_CHOICES)} (block-wise FP8 weights; INT4 AWQ / GPTQ "
                             "weights) or None (as the checkpoint is)"),
            "pipeline_parallel_size": (self.pipeline_parallel_size != 1,
                                       "nv has no pipeline parallelism; use tensor_parallel_size"),
            "distributed_executor_backend": (self.distributed_executor_backend not in (None, "mp"),
                                             "nv runs tensor-parallel workers as local processes; use "
                                             "'mp' or leave it unset"),
            "cpu_offload_gb": (self.cpu_offload_gb != 0,
                               "nv keeps every weight on the device; use 0"),
            "enable_lora": (self.enable_lora is True, "nv has no LoRA adapters; leave it False"),
        }
        for name, (refused, why) in refusals.items():
            if refused:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported: {why}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) \
                or not 0 <= self.max_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"max_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.max_logprobs!r}")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got "
                             f"{self.generation_config!r}")
        if self.generation_config not in ("auto", "vllm") and not Path(self.generation_config).is_dir():
            raise ValueError(f"generation_config={self.generation_config!r} is neither 'auto', 'vllm' nor "
                             "a folder")
        if self.cuda_graph_mode is not None and self.cuda_graph_mode.lower() not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph_mode must be one of {', '.join(CUDA_GRAPH_MODES)}, got "
                             f"{self.cuda_graph_mode!r}")
        if self.enforce_eager and self.cuda_graph_mode not in (None, "none"):
            raise ValueError(f"enforce_eager=True and cuda_graph_mode={self.cuda_graph_mode!r} contradict each "
                             "other; give one of them")
        SpeculativeConfig.from_value(self.speculative_config)      # ValueError naming the problem, now
        if self.swap_space != DEFAULT_SWAP_SPACE_GIB:
            logger.warning("swap_space=%s is ignored: nv preempts by recomputing, not by swapping",
                           self.swap_space)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """EngineArgs(model=model, **kwargs); an unknown keyword raises TypeError naming it and listing
        the accepted ones."""
        accepted = set(cls.field_names()) - {"model"}
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}; accepted: {sorted(accepted)}")
        return cls(model=model, **kwargs)

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per field except `model` (each command places the model its own way):
        --name-with-dashes (plus aliases such as -tp); booleans as --x/--no-x. A command may change a
        default afterwards with parser.set_defaults."""
        group = parser.add_argument_group("engine arguments")
        for f in dataclasses.fields(cls):
            if f.name == "model":
                continue
            meta = f.metadata
            flags = [f"--{f.name.replace('_', '-')}", *meta["aliases"]]
            if meta["type"] is bool:
                group.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction,
                                   default=f.default, help=meta["help"])
            else:
                shown = meta["help"] if "default" in meta["help"] else meta["help"] + " (default: %(default)s)"
                group.add_argument(*flags, dest=f.name, type=meta["type"], default=f.default,
                                   choices=meta["choices"], help=shown)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The EngineArgs of a namespace parsed by a parser that add_cli_arguments filled (and that
        has `model`)."""
        return cls(**{name: getattr(args, name) for name in cls.field_names()})

    # ---- resolution --------------------------------------------------------------------------
    def resolved_cuda_graph_mode(self) -> str:
        """cuda_graph_mode in lower case (vLLM spells its modes in capitals); "none" with enforce_eager."""
        if self.enforce_eager:
            return "none"
        return "full_and_piecewise" if self.cuda_graph_mode is None else self.cuda_graph_mode.lower()

    def with_resolved_paths(self) -> EngineArgs:
        """These arguments with `model` (hub download, GGUF conversion) and `tokenizer` resolved to local
        paths: what another process resolves to the same config without fetching or converting again.
        ValueError when the model cannot be found."""
        from nv_engine.model_loader.model_path import resolve_model_path

        path = resolve_model_path(self.model, revision=self.revision, cache_dir=self.download_dir,
                                  token=self.hf_token)
        tokenizer = self.tokenizer
        if tokenizer is not None and not Path(tokenizer).expanduser().exists():
            tokenizer = resolve_model_path(tokenizer, revision=self.tokenizer_revision,
                                           cache_dir=self.download_dir, token=self.hf_token)
        return dataclasses.replace(self, model=path, tokenizer=tokenizer)

    def create_engine_config(self, hf_config: Any = None) -> EngineConfig:
        """Resolve the model path (hub download included), read its HF config, pick the dtype, device and
        limits, and validate every setting (ValueError naming the field)."""
        from nv_engine.model_loader.model_path import load_hf_config

        kv_events_config = KVEventsConfig.from_value(self.kv_events_config)   # refused before the model is read
        speculative_config = SpeculativeConfig.from_value(self.speculative_config)
        resolved = self.with_resolved_paths()
        path, tokenizer = resolved.model, resolved.tokenizer
        if hf_config is None:
            hf_config = load_hf_config(path)
        device = resolve_device(self.device)
        max_model_len = resolve_max_model_len(self.max_model_len, hf_config)
        if speculative_config is not None and speculative_config.model is not None:   # draft_model: checked now
            from nv_engine.model_loader.model_path import resolve_model_path

            draft_path = resolve_model_path(speculative_config.model, cache_dir=self.download_dir, token=self.hf_token)
            draft_hf_config = load_hf_config(draft_path)
            speculative_config.check_draft(draft_hf_config, hf_config, max_model_len, self.tensor_parallel_size)
            resolve_quantization(None, draft_hf_config)     # a draft checkpoint's quantization nv cannot run: now
            speculative_config = dataclasses.replace(speculative_config, model=draft_path)
        max_num_batched_tokens = self.max_num_batched_tokens
        if self.enable_chunked_prefill is False:
            # vLLM's meaning of "no chunked prefill": every prompt fits one step's token budget
            if max_num_batched_tokens is None:
                max_num_batched_tokens = max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
            elif max_num_batched_tokens < max_model_len:
                raise ValueError(f"enable_chunked_prefill=False needs max_num_batched_tokens "
                                 f"({max_num_batched_tokens}) >= max_model_len ({max_model_len}) so that "
                                 "a prompt never has to be split")
        generation_config = self.generation_config
        if generation_config not in ("auto", "vllm"):
            generation_config = str(Path(generation_config).expanduser().resolve())
        config = EngineConfig(
            model=path, hf_config=hf_config, tensor_parallel_size=self.tensor_parallel_size,
            data_parallel_size=self.data_parallel_size,
            dtype=resolve_dtype(self.dtype, hf_config, device), device=device, seed=self.seed,
            max_model_len=max_model_len,
            max_num_seqs=DEFAULT_MAX_NUM_SEQS if self.max_num_seqs is None else self.max_num_seqs,
            max_num_batched_tokens=(DEFAULT_MAX_NUM_BATCHED_TOKENS if max_num_batched_tokens is None
                                    else max_num_batched_tokens),
            block_size=DEFAULT_BLOCK_SIZE if self.block_size is None else self.block_size,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_prefix_caching=bool(self.enable_prefix_caching),
            gpu_memory_utilization=self.gpu_memory_utilization, cuda_graph_mode=self.resolved_cuda_graph_mode(),
            fused_ops=self.fused_ops, grammar_matcher_process=self.grammar_matcher_process,
            cpu_kv_cache_space_gib=self.cpu_kv_cache_space_gib, distributed_timeout_s=self.distributed_timeout_s,
            attention_backend=self.attention_backend, num_gpu_blocks_override=self.num_gpu_blocks_override,
            tokenizer=tokenizer, async_scheduling=self.async_scheduling,
            generation_config=generation_config, max_logprobs=self.max_logprobs,
            disable_log_stats=bool(self.disable_log_stats),
            disable_custom_all_reduce=bool(self.disable_custom_all_reduce), kv_events_config=kv_events_config,
            speculative_config=speculative_config, kv_cache_dtype=self.kv_cache_dtype,
            calculate_kv_scales=self.calculate_kv_scales,
            quantization=resolve_quantization(self.quantization, hf_config), stream_interval=self.stream_interval)
        config.validate()
        return config
