"""INT4 copies of tiny test checkpoints, packed as AutoAWQ and AutoGPTQ write them (tests use them).

Every decoder projection `<name>.weight` [out, in] is quantized in groups of 128 inputs and replaced by
`<name>.qweight`, `<name>.qzeros`, `<name>.scales` (float16) and, for GPTQ, `<name>.g_idx`; embeddings, norms and
the LM head stay as they are, and config.json gains the format's quantization_config.
  AWQ (GEMM version): asymmetric round to nearest (nv_kernels.int4_gemm.quantize_int4); qweight int32 [in, out / 8]
      with the codes of columns 8 j + (0, 2, 4, 6, 1, 3, 5, 7)[i] at bits 4 i of word j, qzeros [in / 128, out / 8]
      the same way, scales [in / 128, out].
  GPTQ (checkpoint_format "gptq", sym true, desc_act false): symmetric round to nearest (zero 8, scale = 2 amax / 15);
      qweight int32 [in / 8, out] with input rows 8 j + i at bits 4 i of word j, qzeros [in / 128, out / 8] with
      zero - 1 = 7 at bits 4 i for column 8 j + i, scales [in / 128, out], g_idx = k // 128.
The packing here is written from those facts on its own (not with nv's readers), so a test that loads these
checkpoints checks nv's readers against the formats. `broken` writes a deliberately wrong variant:
"nibble_order" packs the codes in plain order (AWQ) or the input rows reversed within a word (GPTQ);
"half_scales" stores every scale halved. `zero_biases` adds the all-zero `<name>.bias` AutoGPTQ saves for every layer.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from quantized_checkpoints import copy_non_weight_files, is_projection_weight
from safetensors.torch import load_file, save_file

from nv_kernels.int4_gemm import quantize_int4

GROUP = 128
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None}
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
               "checkpoint_format": "gptq", "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
               "lm_head": False}


def quantize_symmetric(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ's symmetric grid without its error feedback: weight [out, in] -> (codes uint8 [out, in], scales fp16
    [out, in / 128], zeros uint8 [out, in / 128], all 8)."""
    out, k = weight.shape
    groups = weight.float().reshape(out, k // GROUP, GROUP)
    scales = (2 * groups.abs().amax(dim=2).clamp(min=1e-5) / 15).half()
    codes = (torch.round(groups / scales.float()[..., None]) + 8).clamp(0, 15)
    return codes.to(torch.uint8).reshape(out, k), scales, torch.full_like(scales, 8, dtype=torch.uint8)


def quantized(weight: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [out, in], scales [out, in / 128], zeros [out, in / 128]) as `method`'s test checkpoint holds them."""
    return quantize_int4(weight) if method == "awq" else quantize_symmetric(weight)


def _words(fields: list[torch.Tensor]) -> torch.Tensor:
    """Eight 4-bit tensors of one shape -> int32 words, fields[i] at bits 4 i (two's complement above 2^31)."""
    total = torch.zeros_like(fields[0], dtype=torch.int64)
    for i, field in enumerate(fields):
        total |= (field.to(torch.int64) & 0xF) << (4 * i)
    return torch.where(total >= 2 ** 31, total - 2 ** 32, total).to(torch.int32)


def pack_awq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, order: tuple[int, ...] = AWQ_PACK_ORDER
             ) -> dict[str, torch.Tensor]:
    """Canonical [out, in] codes -> AWQ's qweight [in, out / 8], qzeros [in / 128, out / 8], scales [in / 128, out]."""
    by_input = codes.t()                                                       # [in, out]
    qweight = _words([by_input[:, o::8] for o in order])                       # column 8 j + order[i] at bits 4 i
    zeros_t = zeros.t()                                                        # [in / 128, out]
    return {"qweight": qweight, "qzeros": _words([zeros_t[:, o::8] for o in order]),
            "scales": scales.t().contiguous().half()}


def pack_gptq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, reverse_rows: bool = False
              ) -> dict[str, torch.Tensor]:
    """Canonical [out, in] codes -> GPTQ v1's qweight [in / 8, out], qzeros [in / 128, out / 8] (zero - 1), scales
    [in / 128, out], g_idx [in]."""
    by_input = codes.t()                                                       # [in, out]
    rows = range(7, -1, -1) if reverse_rows else range(8)
    qweight = _words([by_input[r::8, :] for r in rows])                       # input row 8 j + i at bits 4 i
    stored = zeros.t().to(torch.int64) - 1                                     # [in / 128, out]
    in_features = codes.shape[1]
    return {"qweight": qweight, "qzeros": _words([stored[:, c::8] for c in range(8)]),
            "scales": scales.t().contiguous().half(),
            "g_idx": torch.arange(in_features, dtype=torch.int32) // GROUP}


def write_int4_checkpoint(src: Path, dst: Path, method: str, broken: str | None = None, zero_biases: bool = False
                          ) -> Path:
    """A copy of the float checkpoint `src` in `dst` with its projections in `method`'s INT4 format ("awq" or
    "gptq"); `broken`: None, "nibble_order" or "half_scales"."""
    copy_non_weight_files(src, dst)
    for file in src.glob("*.safetensors"):
        tensors = {}
        for name, tensor in load_file(str(file)).items():
            if not is_projection_weight(name):
                tensors[name] = tensor
                continue
            codes, scales, zeros = quantized(tensor, method)
            if broken == "half_scales":
                scales = scales / 2
            wrong_order = broken == "nibble_order"
            if method == "awq":
                packed = pack_awq(codes, scales, zeros, tuple(range(8)) if wrong_order else AWQ_PACK_ORDER)
            else:
                packed = pack_gptq(codes, scales, zeros, reverse_rows=wrong_order)
            prefix = name.removesuffix("weight")
            tensors.update({prefix + key: value.contiguous() for key, value in packed.items()})
            if zero_biases:
                tensors.setdefault(prefix + "bias", torch.zeros(codes.shape[0], dtype=torch.float16))
        save_file(tensors, str(dst / file.name), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = dict(AWQ_CONFIG if method == "awq" else GPTQ_CONFIG)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def write_dequantized_checkpoint(src: Path, dst: Path, method: str) -> Path:
    """A float copy of `src` in `dst` whose projections hold `method`'s dequantized weights, (code - zero) * scale:
    the model an INT4 checkpoint of `src` stands for, run without INT4 (what HF's AWQ / GPTQ modules compute)."""
    copy_non_weight_files(src, dst)
    weights = reference_weights(src, method)
    for file in src.glob("*.safetensors"):
        tensors = load_file(str(file))
        save_file({name: weights.get(name, tensor) for name, tensor in tensors.items()}, str(dst / file.name),
                  metadata={"format": "pt"})
    return dst


def reference_weights(src: Path, method: str) -> dict[str, torch.Tensor]:
    """The dequantized weight of every projection of `src`, (code - zero) * scale in fp32, by checkpoint name."""
    weights = {}
    for file in src.glob("*.safetensors"):
        for name, tensor in load_file(str(file)).items():
            if is_projection_weight(name):
                codes, scales, zeros = quantized(tensor, method)
                weights[name] = ((codes.float() - zeros.float().repeat_interleave(GROUP, 1))
                                 * scales.float().repeat_interleave(GROUP, 1))
    return weights
