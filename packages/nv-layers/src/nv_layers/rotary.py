"""Rotary position embedding (NeoX / HF rotate-half style) with the scaling types real checkpoints use.

Frequencies follow the formulas of transformers' ROPE_INIT_FUNCTIONS (default, linear, dynamic NTK,
YaRN, llama3); the tests compare against those functions. cos/sin are tabulated per position in fp32.
Dynamic NTK: HF recomputes the base from the longest position in the batch, which makes a token's
rotation depend on its batch; here position p uses the base HF uses when p is the newest token
(seq_len = max(p + 1, max_position)), so positions below max_position use the plain frequencies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nv_kernels.fused_dispatch import FLOAT_DTYPES, fused_ops_enabled
from nv_kernels.fused_rope import qk_norm_rope_triton

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    base: float
    scaling: dict | None          # None or a dict with "rope_type" (or legacy "type") and its params
    partial_rotary_factor: float = 1.0


def rope_config_from_hf(config: Any) -> RopeConfig:
    """Read rope settings from a transformers config: 5.x `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = getattr(config, "rope_parameters", None)
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(params, dict) and params:
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        scaling = params
        partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    else:
        base = getattr(config, "rope_theta", 10000.0)
        partial = getattr(config, "partial_rotary_factor", 1.0)
    if scaling is not None and _rope_type(scaling) == "default":
        scaling = None
    return RopeConfig(float(base), dict(scaling) if scaling else None, float(partial or 1.0))


def _rope_type(scaling: dict) -> str:
    return scaling.get("rope_type", scaling.get("type", "default")) or "default"


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    # [dim/2]
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))


def _yarn(base: float, dim: int, max_position: int, s: dict) -> tuple[torch.Tensor, float, int]:
    original = s.get("original_max_position_embeddings") or max_position
    factor = s.get("factor") or max_position / original

    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = _default_inv_freq(base, dim)
    interpolation = extrapolation / factor
    keep = 1 - ramp                                # 1: keep original frequency, 0: interpolate
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq, float(attention_factor), max(max_position, int(original * factor))


def _llama3(base: float, dim: int, s: dict) -> torch.Tensor:
    inv_freq = _default_inv_freq(base, dim)
    factor, low_ff, high_ff = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low_ff, old_len / high_ff
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def compute_cos_sin(rotary_dim: int, max_position: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    """[P, rotary_dim] fp32 table: cos in the first half, sin in the second (already scaled)."""
    rope_type = _rope_type(rope_scaling) if rope_scaling else "default"
    s = rope_scaling or {}
    scale = 1.0
    num_positions = max_position
    if rope_type == "default":
        inv_freq = _default_inv_freq(base, rotary_dim)
    elif rope_type == "linear":
        inv_freq = _default_inv_freq(base, rotary_dim) / s["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3(base, rotary_dim, s)
    elif rope_type == "yarn":
        inv_freq, scale, num_positions = _yarn(base, rotary_dim, max_position, s)
    elif rope_type == "dynamic":
        factor = s["factor"]
        num_positions = int(max_position * factor)
        pos = torch.arange(num_positions, dtype=torch.float64)
        seq_len = torch.clamp(pos + 1, min=max_position)
        bases = base * ((factor * seq_len / max_position) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
        inv = 1.0 / (bases.to(torch.float32)[:, None] ** exponents[None, :])   # [P, rd/2]
        freqs = pos.to(torch.float32)[:, None] * inv
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    else:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    freqs = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]   # [P, rd/2]
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


class RotaryEmbedding(nn.Module):
    cos_sin_cache: torch.Tensor  # a buffer (register_buffer): declared for the type checker
    def __init__(self, head_size: int, rotary_dim: int, cos_sin: torch.Tensor) -> None:
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"rotary_dim {rotary_dim} must be even and at most head_size {head_size}")
        self.head_size, self.rotary_dim = head_size, rotary_dim
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)   # [P, rotary_dim]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(shape[0], -1, self.head_size)                           # [T, H, D]
        half = self.rotary_dim // 2
        x1, x2 = x[..., :half].float(), x[..., half:self.rotary_dim].float()
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        if self.rotary_dim < self.head_size:
            out = torch.cat([out, x[..., self.rotary_dim:]], dim=-1)
        return out.reshape(shape)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [T]; q [T, Hq, D] or [T, Hq*D]; k [T, Hkv, D] or [T, Hkv*D]
        if fused_ops_enabled(q, k) and q.dtype == k.dtype and q.dtype in FLOAT_DTYPES:
            # one Triton kernel for q and k (nv_kernels.fused_rope), same math as _rotate
            q_out, k_out, _ = qk_norm_rope_triton(q, k, None, positions, self.cos_sin_cache,
                                                  head_dim=self.head_size, rotary_dim=self.rotary_dim)
            return q_out.view(q.shape), k_out.view(k.shape)
        cos_sin = self.cos_sin_cache.index_select(0, positions).float()     # [T, rd]
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)                     # [T, 1, rd/2]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def get_rope(head_dim: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: dict | None = None) -> RotaryEmbedding:
    """A RotaryEmbedding for positions 0..max_position-1 (more for yarn / dynamic, as they extend)."""
    cos_sin = compute_cos_sin(rotary_dim, max_position, base, rope_scaling)
    return RotaryEmbedding(head_dim, rotary_dim, cos_sin)
