"""The pre-norm GQA decoder with a SwiGLU MLP that Qwen2/Qwen3 and Llama share (after HF's modeling_qwen3 /
modeling_llama and nano-vllm's qwen3), parameterised by `LayerOptions`:

  qk_norm   per-head RMSNorm on q and k before rotary (Qwen3)
  qkv_bias  bias on the fused q/k/v projection;  o_bias: on o_proj;  mlp_bias: on gate/up and down

Model packages subclass `DecoderForCausalLM` and set `layer_options(config)`. Weight names follow HF
(model.layers.N.self_attn.q_proj ...), so HF checkpoints load with `load_safetensors` through
PACKED_MODULES_MAPPING (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nv_kernels.decode_rope import DecodeRope
from nv_kernels.fp8_skinny_gemm import fp8_skinny_gemm, fp8_skinny_gemm_applies
from nv_kernels.fused_dispatch import FLOAT_DTYPES, fused_ops_enabled
from nv_kernels.fused_rope import can_store_into, qk_norm_rope_triton
from nv_kernels.kv_quant import is_fp8
from nv_kernels.skinny_gemm import skinny_gemm, skinny_gemm_applies, skinny_norm_gemm, skinny_norm_gemm_applies
from nv_layers.activation import SiluAndMul
from nv_layers.attention import Attention
from nv_layers.decoder_config import DecoderDims, check_tp, read_dims
from nv_layers.embedding import ParallelLMHead, VocabParallelEmbedding
from nv_layers.forward_context import ForwardContext, get_forward_context
from nv_layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nv_layers.norm import RMSNorm
from nv_layers.parallel_state import get_tp_size
from nv_layers.rotary import get_rope

PACKED_MODULES_MAPPING: dict[str, tuple[str, Any]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@dataclass(frozen=True)
class LayerOptions:
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False


class DecoderAttention(nn.Module):
    def __init__(self, dims: DecoderDims, opts: LayerOptions) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(dims.hidden_size, dims.head_dim, dims.num_heads,
                                          dims.num_kv_heads, bias=opts.qkv_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = dims.head_dim
        self.o_proj = RowParallelLinear(dims.num_heads * dims.head_dim, dims.hidden_size, bias=opts.o_bias)
        rotary_dim = int(dims.head_dim * dims.rope.partial_rotary_factor)
        self.rotary_emb = get_rope(dims.head_dim, rotary_dim, dims.max_position, dims.rope.base,
                                   dims.rope.scaling)
        self.attn = Attention(self.num_heads, dims.head_dim, dims.head_dim ** -0.5, self.num_kv_heads)
        self.qk_norm = opts.qk_norm
        if opts.qk_norm:
            self.q_norm = RMSNorm(dims.head_dim, eps=dims.rms_norm_eps)
            self.k_norm = RMSNorm(dims.head_dim, eps=dims.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # hidden [T, H] -> [T, H]
        return self.attend(positions, self.qkv_proj(hidden))

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Attention and o_proj from the q/k/v projection's output qkv [T, (Hq + 2 Hkv) * D] -> [T, H]."""
        num_tokens = qkv.shape[0]
        if self._can_fuse(qkv):
            return self.o_proj(self._fused_attention(positions, qkv))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)               # [T, Hq, D]
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)            # [T, Hkv, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), v.contiguous())
        return self.o_proj(out)

    def _can_fuse(self, qkv: torch.Tensor) -> bool:
        if not fused_ops_enabled(qkv) or qkv.dtype not in FLOAT_DTYPES:
            return False
        return not self.qk_norm or self.q_norm.weight.dtype == self.k_norm.weight.dtype == qkv.dtype

    def _decode_finishes_rope(self, ctx: ForwardContext, num_tokens: int, device: torch.device) -> bool:
        """A decode step whose attention kernel can norm and rotate q and k and store k / v itself
        (nv_kernels.decode_rope), where the backend says that pays at this batch: one kernel per layer fewer.
        Not while FP8 scales are calibrated (the layer records K / V first) nor with partial rotary. The backend's
        capability (nv_kernels.interface.DecodesWithRope) is tested with hasattr: a Protocol isinstance check costs
        microseconds, per layer and eager step; a backend without it keeps the separate kernel."""
        if not (ctx.is_decode and ctx.query_len == 1 and ctx.attention_split is None and self.attn.kv_amax is None
                and self.rotary_emb.rotary_dim == self.head_dim and hasattr(ctx.backend, "decode_with_rope")):
            return False
        return ctx.backend.decode_rope_pays(num_tokens, self.num_kv_heads, ctx.max_seqlen_k, device,  # type: ignore[attr-defined]
                                            is_fp8(self.attn.k_cache.dtype))

    def _fused_attention(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """CUDA: q/k norm, rotary and the KV-cache store in one kernel (nv_kernels.fused_rope)."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)  # strided views
        kwargs: dict[str, Any] = {}
        if self.qk_norm:
            kwargs.update(q_weight=self.q_norm.weight, k_weight=self.k_norm.weight, eps=self.q_norm.eps)
        attn = self.attn
        store = can_store_into(attn.k_cache, attn.v_cache, self.num_kv_heads, self.head_dim)
        ctx = get_forward_context()
        if store and self._decode_finishes_rope(ctx, num_tokens, qkv.device):
            rope = DecodeRope(k=k.view(num_tokens, self.num_kv_heads, self.head_dim),
                              v=v.view(num_tokens, self.num_kv_heads, self.head_dim), positions=positions,
                              slot_mapping=ctx.slot_mapping, cos_sin_cache=self.rotary_emb.cos_sin_cache, **kwargs)
            out = attn.attend_decode_with_rope(q.view(num_tokens, self.num_heads, self.head_dim), rope, ctx)
            return out.view(num_tokens, -1)
        if store:
            kwargs.update(k_cache=attn.k_cache, v_cache=attn.v_cache,
                          slot_mapping=ctx.slot_mapping, **attn.kv_scale_kwargs())
        q, k, v_heads = qk_norm_rope_triton(q, k, v, positions, self.rotary_emb.cos_sin_cache, head_dim=self.head_dim,
                                            rotary_dim=self.rotary_emb.rotary_dim, **kwargs)   # [T, H, D] each
        v = v if v_heads is None else v_heads  # v_heads is v as [T, Hkv, D] (None only when v is)
        return attn(q.view(num_tokens, -1), k.view(num_tokens, -1), v.view(num_tokens, -1), kv_stored=store)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up in one column-parallel GEMM.

    At decode batch sizes (nv_kernels.skinny_gemm applies, or nv_kernels.fp8_skinny_gemm to block-FP8 weights)
    SiLU-and-mul runs in that GEMM's epilogue: this rank's weight is [gate_local; up_local], the stacked layout
    the gated kernels read. INT4 weights do the same at every batch size where the INT4 kernel runs
    (nv_kernels.int4_gemm)."""

    def __init__(self, dims: DecoderDims, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(dims.hidden_size, [dims.intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(dims.intermediate_size, dims.hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, H] -> [T, H]
        gate_up = self.gate_up_proj
        if skinny_gemm_applies(x, gate_up.weight, gate_up.bias):
            return self.down_proj(skinny_gemm(x, gate_up.weight, gate_up.bias, gated=True))   # [T, I_local] in
        act = gate_up.int4_silu_and_mul(x)                                 # INT4 weights: the same in one kernel
        if act is not None:
            return self.down_proj(act)
        scale = gate_up.weight_scale_inv
        if scale is not None and fp8_skinny_gemm_applies(x, gate_up.weight, scale, gate_up.bias):
            return self.down_proj(fp8_skinny_gemm(x, gate_up.weight, scale, gate_up.bias, gated=True))
        return self.down_proj(self.act_fn(gate_up(x)))


class DecoderLayer(nn.Module):
    def __init__(self, dims: DecoderDims, opts: LayerOptions) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(dims, opts)
        self.mlp = GatedMLP(dims, opts.mlp_bias)
        self.input_layernorm = RMSNorm(dims.hidden_size, eps=dims.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(dims.hidden_size, eps=dims.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # the residual add is fused into the next norm: returns (mlp output, residual stream so far)
        if self._norms_fuse_into_gemms(hidden, residual):
            return self._forward_norms_in_gemms(positions, hidden, residual)
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, stream = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), stream

    def _norms_fuse_into_gemms(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> bool:
        """Decode batch sizes on CUDA (nv_kernels.skinny_gemm): each add + RMSNorm runs in the prologue of
        the GEMM after it (qkv, gate_up). The attention output has hidden's shape and dtype, so hidden stands
        in for it when checking gate_up."""
        qkv, gate_up = self.self_attn.qkv_proj, self.mlp.gate_up_proj
        return (skinny_norm_gemm_applies(hidden, residual, self.input_layernorm.weight, qkv.weight, qkv.bias)
                and skinny_norm_gemm_applies(hidden, hidden, self.post_attention_layernorm.weight,
                                             gate_up.weight, gate_up.bias))

    def _forward_norms_in_gemms(self, positions: torch.Tensor, hidden: torch.Tensor,
                                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # the same layer as forward's other path, in four GEMM launches and no norm kernel
        attn, mlp = self.self_attn, self.mlp
        pre, post = self.input_layernorm, self.post_attention_layernorm
        qkv, residual = skinny_norm_gemm(hidden, residual, pre.weight, pre.eps, attn.qkv_proj.weight,
                                         attn.qkv_proj.bias)                   # [T, (Hq + 2 Hkv) * D], [T, H]
        hidden = attn.attend(positions, qkv)
        act, stream = skinny_norm_gemm(hidden, residual, post.weight, post.eps, mlp.gate_up_proj.weight,
                                       mlp.gate_up_proj.bias, gated=True)    # silu(gate) * up [T, I_local]
        return mlp.down_proj(act), stream


class DecoderModel(nn.Module):
    def __init__(self, dims: DecoderDims, opts: LayerOptions) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(dims, opts) for _ in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size, eps=dims.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None                # [T, H]
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DecoderForCausalLM(nn.Module):
    """A causal LM on the shared decoder. forward(input_ids [T], positions [T]) -> hidden [T, H];
    compute_logits(hidden) -> [S, V]. Subclasses choose `layer_options(config)`."""

    packed_modules_mapping = PACKED_MODULES_MAPPING

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        dims = read_dims(config)
        check_tp(dims, get_tp_size())
        self.dims = dims
        self.model = DecoderModel(dims, self.layer_options(config))
        self.lm_head = ParallelLMHead(dims.vocab_size, dims.hidden_size)
        if dims.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    @classmethod
    def layer_options(cls, config: Any) -> LayerOptions:
        return LayerOptions()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [S, V]; inside the step's forward context only ctx.logits_indices rows are kept."""
        return self.lm_head(hidden)
