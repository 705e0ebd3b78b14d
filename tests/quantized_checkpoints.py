"""Quantized copies of tiny test checkpoints, written as the public formats lay them out (tests use them).

Block FP8 (Qwen3-FP8 / DeepSeek-V3): every decoder projection `<name>.weight` becomes float8_e4m3fn [N, K] plus
`<name>.weight_scale_inv` float32 [ceil(N/128), ceil(K/128)] (round to nearest, scale = block amax / 448), and
config.json gains quantization_config {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [128, 128]}. Embeddings, norms and the LM head stay as they are.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nv_kernels.fp8_block_gemm import quantize_fp8_block
from nv_layers.linear import LinearBase

FP8_QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": [128, 128]}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_projection_weight(name: str) -> bool:
    """Whether a checkpoint tensor is a linear projection's weight (what a quantized checkpoint stores quantized)."""
    return name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS


def copy_non_weight_files(src: Path, dst: Path) -> None:
    """dst created, with every file of the checkpoint `src` but its safetensors (config, tokenizer, ...)."""
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.suffix != ".safetensors" and file.is_file():
            shutil.copy(file, dst / file.name)


def write_fp8_block_checkpoint(src: Path, dst: Path, quantization_config: dict | None = None) -> Path:
    """A copy of the checkpoint `src` in `dst` with its projections block-FP8 quantized."""
    copy_non_weight_files(src, dst)
    for file in src.glob("*.safetensors"):
        tensors = {}
        for name, tensor in load_file(str(file)).items():
            if is_projection_weight(name):
                tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(tensor)
            else:
                tensors[name] = tensor
        save_file(tensors, str(dst / file.name), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config or FP8_QUANTIZATION_CONFIG
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def runtime_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the built model holds as weights: its parameters (tied ones once) and each quantized layer's scales
    and zeros."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model.modules():
        if isinstance(layer, LinearBase):
            for extra in (layer.weight_scale_inv, getattr(layer, "weight_scales", None),
                          getattr(layer, "weight_zeros", None)):
                if isinstance(extra, torch.Tensor):
                    total += extra.numel() * extra.element_size()
    return total
