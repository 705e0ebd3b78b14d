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

INT4 checkpoints (AWQ / GPTQ, nv_layers.int4_checkpoint; `build_model` finds the format in the config's
quantization_config) keep their codes: every linear layer whose `<name>.qweight` the checkpoint holds expects INT4
(`LinearBase.expect_int4_checkpoint`), each `qweight` / `qzeros` / `scales` tensor is converted to the canonical
layout as it loads (GPTQ's `g_idx` is checked to be trivial and dropped, and so are the zero biases AutoGPTQ writes
for layers without one), the layers' weight loaders cut this rank's
shard, and each layer packs its shard for the kernel at the end (`pack_int4`). Layers the checkpoint holds as float
weights (AWQ's modules_to_not_convert) load as they are. `build_model(..., quantization="awq")` on an unquantized
checkpoint quantizes every linear layer to INT4 instead (round to nearest; no calibration).
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
from nv_layers.int4_checkpoint import Int4CheckpointFormat
from nv_layers.linear import LinearBase
from nv_layers.weights import default_weight_loader

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)    # old checkpoints store rope buffers
_MAX_LISTED = 20
KV_SCALE_NAMES = {"k_scale": ("k",), "v_scale": ("v",), "kv_scale": ("k", "v")}
_KV_SCALE_OWNERS = ("attn", "k_proj", "v_proj")   # checkpoint modules a scale may hang under
FP8_SCALE_SUFFIX = "_scale_inv"                   # `<linear>.weight_scale_inv` scales `<linear>.weight`
QUANTIZATIONS = ("fp8", "awq")                    # what quantize_linear_layers makes of float weights
INT4_SUFFIXES = ("qweight", "qzeros", "scales")  # an INT4 layer's checkpoint tensors


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


def _expect_int4(model: nn.Module, files: list[Path], packed: dict) -> list[LinearBase]:
    """Every linear layer of which the checkpoint holds a `qweight` (under its own or a packed name), switched to
    expect INT4 tensors; returned in model order."""
    params = dict(model.named_parameters())
    modules: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith(".qweight"):
                    target = _resolve(name.removesuffix("qweight") + "weight", packed, params)
                    if target is not None:
                        modules.add(target[0].removesuffix(".weight"))
    layers = [m for n, m in model.named_modules() if n in modules and isinstance(m, LinearBase)]
    for layer in layers:
        layer.expect_int4_checkpoint()
    return layers


def load_safetensors(model: nn.Module, path: str | Path, int4: Int4CheckpointFormat | None = None) -> None:
    """Load every *.safetensors file in `path` into `model`; ValueError on missing / unexpected names. `int4`: the
    checkpoint's INT4 format (AWQ / GPTQ), whose layers are loaded as INT4 and packed for the kernel."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    packed: dict = getattr(model, "packed_modules_mapping", {}) or {}
    int4_layers = _expect_int4(model, files, packed) if int4 is not None else []
    params = dict(model.named_parameters())                       # tied duplicates appear once
    aliases = set(dict(model.named_parameters(remove_duplicate=False))) - set(params)

    attentions = {n: m for n, m in model.named_modules() if isinstance(m, Attention)}

    plan: list[tuple[Path, str, str, object]] = []                 # (file, ckpt name, param, shard)
    unexpected: set[str] = set()
    fp8_scales: dict[str, Path] = {}                                # weight name -> file holding its scale
    dropped: list[tuple[Path, str]] = []                            # INT4 extras, checked then dropped
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in aliases or name.endswith(IGNORED_SUFFIXES):
                    continue
                if int4 is not None and name.endswith(".g_idx"):
                    dropped.append((file, name))
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
                if target is None and int4 is not None and name.endswith(".bias"):
                    dropped.append((file, name))          # AutoGPTQ saves a bias for every INT4 layer
                elif target is None:
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
                    suffix = name.rpartition(".")[2]
                    if name in fp8_scales:
                        weight = _dequantized(f.get_tensor(name), name, fp8_scales[name], param.dtype)
                    elif int4 is not None and suffix in INT4_SUFFIXES and param_name.endswith("." + suffix):
                        weight = int4.canonical(suffix, f.get_tensor(name))
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
        for file, name in dropped:
            with safe_open(str(file), framework="pt") as f:
                _check_dropped(name, f.get_tensor(name))
        for layer in int4_layers:
            layer.pack_int4()
    if int4_layers and torch.cuda.is_initialized():
        torch.cuda.empty_cache()   # the canonical codes' memory back to the device, for the KV cache to size into


def _check_dropped(name: str, tensor: torch.Tensor) -> None:
    """An INT4 checkpoint's tensor that nothing loads: a trivial GPTQ g_idx, or a zero bias of a layer the model
    builds without one (as AutoGPTQ writes them); ValueError for anything else."""
    if name.endswith(".g_idx"):
        Int4CheckpointFormat.check_g_idx(tensor, name)
    elif bool(tensor.any()):
        raise ValueError(f"checkpoint tensor {name!r}: a non-zero bias for a layer the model builds without one")


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
    """Every nv_layers linear layer of `model` to `quantization` ("fp8": block-wise 128 x 128, W8A8; "awq": INT4
    in groups of 128 inputs, round to nearest, W4A16)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not one of {QUANTIZATIONS}")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LinearBase):
                if quantization == "fp8":
                    module.quantize_fp8_block()
                else:
                    module.quantize_int4()
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
    load_safetensors(path) and, with `quantization`, quantize_linear_layers; returned in eval mode. An AWQ / GPTQ
    checkpoint (its config's quantization_config) loads as INT4; `quantization` must then be None or its method."""
    int4 = Int4CheckpointFormat.from_hf_config(config)
    if int4 is not None and quantization not in (None, int4.method):
        raise ValueError(f"quantization={quantization!r} does not match the checkpoint, which is {int4.method!r}")
    place = contextlib.nullcontext() if device is None else torch.device(device)
    with default_dtype(dtype or torch.get_default_dtype()), place:
        model = model_cls(config)
    load_safetensors(model, path, int4)
    if quantization is not None and int4 is None:
        quantize_linear_layers(model, quantization)
    return model.eval()

