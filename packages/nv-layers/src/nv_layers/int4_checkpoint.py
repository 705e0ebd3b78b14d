"""INT4 checkpoints, AWQ and GPTQ (4 bits, groups of 128 inputs), read into nv's canonical INT4 layout: codes uint8
[out, in], scales float32 [out, in / 128], zeros uint8 [out, in / 128] (nv_kernels.int4_gemm). Rows along the outputs
and groups along the inputs, so the tensor-parallel weight loaders of nv_layers.linear cut them as they cut a float
weight; each rank then packs its shard into the kernel's layout.

The formats, as AutoAWQ, AutoGPTQ / GPTQModel write them and vLLM reads them (W = (code - zero) * scale):
  AWQ ("awq", version "gemm", zero_point true): `qweight` int32 [in, out / 8]; word j of input row k holds the codes
      of output columns 8 j + AWQ_ORDER[i] at bits 4 i, AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7). `qzeros` int32
      [in / 128, out / 8] packed the same way; `scales` float16 [in / 128, out].
  GPTQ ("gptq", desc_act false, sym true or false): `qweight` int32 [in / 8, out]; word j of output column n holds
      the codes of input rows 8 j + i at bits 4 i. `qzeros` int32 [in / 128, out / 8]: the zero of column 8 j + i at
      bits 4 i, stored as zero - 1 by checkpoint_format "gptq" (v1, the default; a symmetric checkpoint's 7 is zero
      8) and as the zero itself by "gptq_v2". `scales` float16 [in / 128, out]. `g_idx` int32 [in] (the group of each
      input row) must be k // 128: act-order checkpoints (desc_act true) reorder inputs, which nv does not.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

BITS = 4
GROUP_SIZE = 128
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # the output column (within 8) of the code at bits 4 i of an AWQ word
INT4_METHODS = ("awq", "gptq")
SUPPORTED = ("AWQ (quant_method 'awq', bits 4, group_size 128, zero_point true, version 'gemm') and GPTQ "
             "(quant_method 'gptq', bits 4, group_size 128, desc_act false, sym true or false, checkpoint_format "
             "'gptq' or 'gptq_v2')")
_SHIFTS = torch.arange(0, 32, BITS, dtype=torch.int32)


def quantization_config_dict(hf_config: Any) -> dict | None:
    """config.json's quantization_config as a dict (transformers may hold it as an object), None when absent."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None or isinstance(qc, dict):
        return qc
    return qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))


def _refuse(method: str, key: str, value: object) -> ValueError:
    return ValueError(f"the checkpoint's quantization_config has {key}={value!r}; for INT4 nv runs {SUPPORTED}, "
                      f"not this {method.upper()} variant")


def _nibbles(words: Tensor) -> Tensor:
    """int32 [..., W] -> its 4-bit fields [..., W, 8], field i from bits 4 i."""
    return (words.to(torch.int32)[..., None] >> _SHIFTS.to(words.device)) & 0xF


@dataclass(frozen=True)
class Int4CheckpointFormat:
    """How one checkpoint stores its INT4 linear layers: `method` "awq" or "gptq", and `zero_offset`, what is added
    to a stored zero point (1 for GPTQ v1 checkpoints)."""

    method: str
    zero_offset: int = 0

    @classmethod
    def from_quantization_config(cls, qc: Mapping[str, Any]) -> Int4CheckpointFormat:
        """The format of a quantization_config whose quant_method is "awq" or "gptq"; ValueError, naming what nv
        supports, for any variant it cannot run."""
        method = str(qc.get("quant_method", "")).lower()
        if method not in INT4_METHODS:
            raise ValueError(f"quant_method={qc.get('quant_method')!r} is not an INT4 format nv reads ({SUPPORTED})")
        bits = qc.get("bits", qc.get("w_bit", BITS))
        group_size = qc.get("group_size", qc.get("q_group_size", GROUP_SIZE))
        if bits != BITS:
            raise _refuse(method, "bits", bits)
        if group_size != GROUP_SIZE:
            raise _refuse(method, "group_size", group_size)
        if method == "awq":
            if qc.get("zero_point", True) is not True:
                raise _refuse(method, "zero_point", qc.get("zero_point"))
            version = str(qc.get("version", "gemm")).lower()
            if version != "gemm":
                raise _refuse(method, "version", qc.get("version"))
            return cls("awq")
        for key, refused in (("desc_act", True), ("lm_head", True), ("is_marlin_format", True)):
            if qc.get(key) is refused:
                raise _refuse(method, key, refused)
        if qc.get("dynamic"):
            raise _refuse(method, "dynamic", qc.get("dynamic"))
        if str(qc.get("pack_dtype", "int32")).removeprefix("torch.") != "int32":
            raise _refuse(method, "pack_dtype", qc.get("pack_dtype"))
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise _refuse(method, "checkpoint_format", qc.get("checkpoint_format"))
        return cls("gptq", zero_offset=1 if fmt == "gptq" else 0)

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> Int4CheckpointFormat | None:
        """The format of a model config's quantization_config; None when it has none or is not AWQ / GPTQ."""
        qc = quantization_config_dict(hf_config)
        if qc is None or str(qc.get("quant_method", "")).lower() not in INT4_METHODS:
            return None
        return cls.from_quantization_config(qc)

    def codes(self, qweight: Tensor) -> Tensor:
        """The checkpoint's qweight -> codes uint8 [out, in]."""
        if self.method == "awq":                                   # [in, out / 8]
            fields = _nibbles(qweight)                             # [in, out / 8, i]
            ordered = torch.empty_like(fields)
            ordered[..., list(AWQ_ORDER)] = fields                 # field i is column 8 j + AWQ_ORDER[i]
            return ordered.reshape(qweight.shape[0], -1).t().to(torch.uint8).contiguous()
        fields = _nibbles(qweight.t())                             # [out, in / 8, i]: input row 8 j + i
        return fields.reshape(qweight.shape[1], -1).to(torch.uint8).contiguous()

    def zeros(self, qzeros: Tensor) -> Tensor:
        """The checkpoint's qzeros [in / 128, out / 8] -> zeros uint8 [out, in / 128] (GPTQ v1: the stored + 1)."""
        fields = _nibbles(qzeros)                                  # [G, out / 8, i]
        if self.method == "awq":
            ordered = torch.empty_like(fields)
            ordered[..., list(AWQ_ORDER)] = fields
            fields = ordered
        return (fields.reshape(qzeros.shape[0], -1) + self.zero_offset).t().to(torch.uint8).contiguous()

    @staticmethod
    def scales(scales: Tensor) -> Tensor:
        """The checkpoint's scales [in / 128, out] -> float32 [out, in / 128] (exact for fp16 and bf16 scales)."""
        return scales.t().float().contiguous()

    @staticmethod
    def check_g_idx(g_idx: Tensor, name: str) -> None:
        """ValueError unless g_idx is the trivial k // 128 (no act-order reordering of the inputs)."""
        trivial = torch.arange(g_idx.numel(), device=g_idx.device) // GROUP_SIZE
        if g_idx.dim() != 1 or not torch.equal(g_idx.to(trivial.dtype), trivial):
            raise ValueError(f"checkpoint tensor {name!r}: a GPTQ g_idx other than input // {GROUP_SIZE} (act-order, "
                             f"desc_act true) reorders the inputs, which nv does not support; nv runs {SUPPORTED}")

    def canonical(self, suffix: str, tensor: Tensor) -> Tensor:
        """A checkpoint tensor `<layer>.<suffix>` (qweight, qzeros, scales) in the canonical layout."""
        if suffix == "qweight":
            return self.codes(tensor)
        if suffix == "qzeros":
            return self.zeros(tensor)
        if suffix == "scales":
            return self.scales(tensor)
        raise ValueError(f"{suffix!r} is not a tensor of an INT4 layer (qweight, qzeros, scales)")


__all__ = ["AWQ_ORDER", "GROUP_SIZE", "INT4_METHODS", "SUPPORTED", "Int4CheckpointFormat", "quantization_config_dict"]
