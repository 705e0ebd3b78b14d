"""Load HF safetensors checkpoints into nv models (idea: nano-vllm's loader + packed-module map).

Checkpoint names map to parameters one to one, except those in `model.packed_modules_mapping`
({"q_proj": ("qkv_proj", "q"), ...}), which load as shards of a fused parameter. Parameters built by
nv_layers read only this rank's shard from disk (lazy safetensors slices). FP8 KV-cache scales are
optional and go to the layer's Attention, named as vLLM reads them: `<attn>.k_scale` / `.v_scale` under
`self_attn`, `self_attn.attn`, or `self_attn.k_proj` / `v_proj`, and the older `.kv_scale` (both).

Block-FP8 checkpoints (Qwen3-FP8 / DeepSeek-V3 layout: `<linear>.weight` float8_e4m3fn [N, K] with
`<linear>.weight_scale_inv` float32 [ceil(N/128), ceil(K/128)]) are dequantized tensor by tensor as they load, so
the layers' tensor-parallel splits cut plain tensors; `build_model(..., quantization="fp8")` then quantizes each
linear layer's local shard again in the same 128 x 128 blocks (for a checkpoint quantized so, amax / 448 per
block, this gives back the checkpoint's codes).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from nv_kernels.fp8_block_gemm import dequantize_fp8_block
from nv_layers.attention import Attention
from nv_layers.embedding import VocabParallelEmbedding
from nv_layers.linear import LinearBase
from nv_layers.weights import default_weight_loader

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)    # old checkpoints store rope buffers
_MAX_LISTED = 20
KV_SCALE_NAMES = {"k_scale": ("k",), "v_scale": ("v",), "kv_scale": ("k", "v")}
_KV_SCALE_OWNERS = ("attn", "k_proj", "v_proj")   # checkpoint modules a scale may hang under
FP8_SCALE_SUFFIX = "_scale_inv"                   # `<linear>.weight_scale_inv` scales `<linear>.weight`
QUANTIZATIONS = ("fp8",)                           # build_model's quantization values (None: as loaded)


def _kv_scale_target(name: str, attentions: dict[str, Attention]) -> tuple[Attention, tuple[str, ...]] | None:
    """A checkpoint KV-cache scale name -> (the Attention it belongs to, "k"/"v"), else None."""
    prefix, _, leaf = name.rpartition(".")
    if leaf not in KV_SCALE_NAMES:
        return None
    head, _, last = prefix.rpartition(".")
    candidates = [prefix, f"{prefix}.attn"] + ([head, f"{head}.attn"] if last in _KV_SCALE_OWNERS else [])
    for candidate in candidates:
        if candidate in attentions:
            return attentions[candidate], KV_SCALE_NAMES[leaf]
    return None


def _resolve(name: str, packed: dict, params: dict) -> tuple[str, object] | None:
    """Checkpoint name -> (parameter name, shard id or None), or None when nothing takes it."""
    if name in params:
        return name, None
    parts = name.split(".")
    for ckpt_part, (fused_part, shard_id) in packed.items():
        if ckpt_part in parts:
            fused = ".".join(fused_part if p == ckpt_part else p for p in parts)
            if fused in params:
                return fused, shard_id
    return None


def _expected_shards(param_name: str, packed: dict) -> dict[object, str]:
    """For a fused parameter: shard id -> checkpoint name that fills it; {} for plain parameters."""
    parts = param_name.split(".")
    shards = {}
    for ckpt_part, (fused_part, shard_id) in packed.items():
        if fused_part in parts:
            shards[shard_id] = ".".join(ckpt_part if p == fused_part else p for p in parts)
    return shards


def _lazy_ok(loader: Callable) -> bool:
    owner = getattr(loader, "__self__", None)
    return loader is default_weight_loader or isinstance(owner, (LinearBase, VocabParallelEmbedding))


def _listing(names: set[str]) -> str:
    shown = sorted(names)[:_MAX_LISTED]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" (and {more} more)" if more else "")


def load_safetensors(model: nn.Module, path: str | Path) -> None:
    """Load every *.safetensors file in `path` into `model`; ValueError on missing / unexpected names."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    packed: dict = getattr(model, "packed_modules_mapping", {}) or {}
    params = dict(model.named_parameters())                       # tied duplicates appear once
    aliases = set(dict(model.named_parameters(remove_duplicate=False))) - set(params)

    attentions = {n: m for n, m in model.named_modules() if isinstance(m, Attention)}

    plan: list[tuple[Path, str, str, object]] = []                 # (file, ckpt name, param, shard)
    unexpected: set[str] = set()
    fp8_scales: dict[str, Path] = {}                                # weight name -> file holding its scale
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in aliases or name.endswith(IGNORED_SUFFIXES):
                    continue
                if name.endswith(".weight" + FP8_SCALE_SUFFIX):
                    fp8_scales[name.removesuffix(FP8_SCALE_SUFFIX)] = file
                    continue
                scale_target = _kv_scale_target(name, attentions)
                if scale_target is not None:
                    attention, which = scale_target
                    for w in which:
                        attention.load_kv_scale(w, f.get_tensor(name))
                    continue
                target = _resolve(name, packed, params)
                if target is None:
                    unexpected.add(name)
                else:
                    plan.append((file, name, *target))

    loaded: dict[str, set] = {}
    for _, _, param_name, shard_id in plan:
        loaded.setdefault(param_name, set()).add(shard_id)
    missing: set[str] = set()
    for param_name in params:
        shards = _expected_shards(param_name, packed)
        got = loaded.get(param_name, set())
        if None in got:
            continue
        if not shards:
            missing.add(param_name)
        else:
            missing.update(ckpt for sid, ckpt in shards.items() if sid not in got)
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"missing weights: {_listing(missing)}")
        if unexpected:
            problems.append(f"unexpected weights: {_listing(unexpected)}")
        raise ValueError(f"checkpoint {path} does not match the model; " + "; ".join(problems))

    by_file: dict[Path, list[tuple[str, str, object]]] = {}
    for file, name, param_name, shard_id in plan:
        by_file.setdefault(file, []).append((name, param_name, shard_id))
    with torch.no_grad():
        for file, entries in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name, param_name, shard_id in entries:
                    param = params[param_name]
                    loader: Callable[..., None] = getattr(param, "weight_loader", default_weight_loader)
                    if name in fp8_scales:
                        weight = _dequantized(f.get_tensor(name), name, fp8_scales[name], param.dtype)
                    else:
                        weight = f.get_slice(name) if _lazy_ok(loader) else f.get_tensor(name)
                    try:
                        if shard_id is None:
                            loader(param, weight)
                        else:
                            loader(param, weight, shard_id)
                    except ValueError as exc:   # shape checks: name the checkpoint tensor and file
                        raise ValueError(f"checkpoint tensor {name!r} in {file.name} does not fit parameter "
                                         f"{param_name!r}: {exc}") from exc


def _dequantized(weight: torch.Tensor, name: str, scale_file: Path, dtype: torch.dtype) -> torch.Tensor:
    """A block-FP8 checkpoint weight times its `weight_scale_inv`, in `dtype`."""
    with safe_open(str(scale_file), framework="pt") as f:
        scale_inv = f.get_tensor(name + FP8_SCALE_SUFFIX)
    blocks = (-(-weight.shape[0] // 128), -(-weight.shape[1] // 128)) if weight.dim() == 2 else None
    if weight.dtype != torch.float8_e4m3fn or tuple(scale_inv.shape) != blocks:
        raise ValueError(f"checkpoint tensor {name!r}: block-FP8 weights are float8_e4m3fn [N, K] with scales "
                         f"[ceil(N/128), ceil(K/128)]; found {weight.dtype} {tuple(weight.shape)} with scales "
                         f"{tuple(scale_inv.shape)}")
    return dequantize_fp8_block(weight, scale_inv, dtype)


def quantize_linear_layers(model: nn.Module, quantization: str) -> None:
    """Every nv_layers linear layer of `model` to `quantization` ("fp8": block-wise 128 x 128, W8A8)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not one of {QUANTIZATIONS}")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LinearBase):
                module.quantize_fp8_block()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()   # the unquantized weights' memory back to the device, for the KV cache to size into


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to `dtype` inside the block (parameters are then created in it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(model_cls: type[nn.Module], config: Any, path: str | Path, *, dtype: torch.dtype | None = None,
                device: str | torch.device | None = None, quantization: str | None = None) -> nn.Module:
    """model_cls(config) created directly in `dtype` on `device` (default: torch's), then
    load_safetensors(path) and, with `quantization`, quantize_linear_layers; returned in eval mode."""
    place = contextlib.nullcontext() if device is None else torch.device(device)
    with default_dtype(dtype or torch.get_default_dtype()), place:
        model = model_cls(config)
    load_safetensors(model, path)
    if quantization is not None:
        quantize_linear_layers(model, quantization)
    return model.eval()

