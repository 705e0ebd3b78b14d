"""Tensor-parallel linear layers (Megatron-style column / row split; design after nano-vllm / vLLM).

Every Parameter carries `weight_loader(param, loaded_weight, shard_id=None)` that copies this rank's
shard of a checkpoint tensor (a torch tensor or a lazy safetensors slice) into the parameter.
Weights are [out, in] like nn.Linear. At decode batch sizes (at most 16 tokens, bf16 / fp16 on CUDA) the
GEMM runs as nv_kernels.skinny_gemm, built to stream the weight once at the memory bandwidth; larger
batches, other dtypes and CPU tensors use F.linear.

`quantize_fp8_block()` turns a loaded layer into block-wise FP8 (nv_kernels.fp8_block_gemm): weight becomes
float8_e4m3fn [out_local, in_local] with weight_scale_inv float32 [ceil(out_local/128), ceil(in_local/128)], the
blocks cut from this rank's shard, and the GEMM becomes W8A8 (the Triton kernel on CUDA, dequantize + matmul in
torch on CPU), except at decode batch sizes on CUDA, where nv_kernels.fp8_skinny_gemm streams the FP8 weight
with the activations kept in the model dtype (W8A16). Checkpoints that are FP8 already are dequantized as they
load (nv_layers.loader), so every tensor-parallel split above works on plain tensors and the scales are always
those of the local shard.

INT4 weights (W4A16, groups of 128 inputs: AWQ / GPTQ checkpoints, nv_kernels.int4_gemm): `expect_int4_checkpoint()`
replaces the weight by the canonical INT4 tensors of the local shard, as parameters named like the checkpoint's
(`qweight` codes uint8 [out_local, in_local], `scales` float32 and `qzeros` uint8 [out_local, in_local / 128]) that
the same weight loaders fill (nv_layers.loader converts each checkpoint tensor to that layout first); `pack_int4()`
then packs them into the kernel's layout: weight int32 [out_local, in_local / 8] with `weight_scales` and
`weight_zeros` [in_local / 128, out_local]. `quantize_int4()` does the same from a loaded float weight (round to
nearest). A row-parallel shard must hold whole groups (in_local a multiple of 128).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nv_kernels.fp8_block_gemm import fp8_block_gemm, quantize_fp8_block
from nv_kernels.fp8_skinny_gemm import fp8_skinny_gemm, fp8_skinny_gemm_applies
from nv_kernels.int4_gemm import GROUP, int4_gemm, int4_gemm_fused, pack_int4_weight, quantize_int4
from nv_kernels.skinny_gemm import skinny_gemm, skinny_gemm_applies
from nv_layers.parallel_state import divide, get_tp_rank, get_tp_size, tp_all_reduce
from nv_layers.weights import WeightLike, check_shape, copy_checked, read_full, read_shard, set_weight_loader


class LinearBase(nn.Module):
    """Holds weight [out_local, in_local] and optional bias [out_local]; y = x W^T + b."""

    weight_scale_inv: torch.Tensor | None = None   # block-FP8 scales once quantize_fp8_block ran, else None
    weight_scales: torch.Tensor | None = None      # INT4 scales [in_local / 128, out_local] once packed, else None
    weight_zeros: torch.Tensor | None = None       # INT4 zero points uint8, the same shape

    def __init__(self, in_local: int, out_local: int, bias: bool) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.weight = nn.Parameter(torch.empty(out_local, in_local), requires_grad=False)
        set_weight_loader(self.weight, self.weight_loader)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False)
            set_weight_loader(self.bias, self.weight_loader)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in_local] @ weight^T (+ bias) -> [..., out_local], on this rank only."""
        if self.weight_scale_inv is not None:
            if fp8_skinny_gemm_applies(x, self.weight, self.weight_scale_inv, bias):
                return fp8_skinny_gemm(x, self.weight, self.weight_scale_inv, bias)
            return fp8_block_gemm(x, self.weight, self.weight_scale_inv, bias)
        if self.weight_zeros is not None and self.weight_scales is not None:
            return int4_gemm(x, self.weight, self.weight_scales, self.weight_zeros, bias)
        if skinny_gemm_applies(x, self.weight, bias):
            return skinny_gemm(x, self.weight, bias)
        return F.linear(x, self.weight, bias)

    def int4_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a [gate; up] layer (a SwiGLU MLP's gate_up) with INT4 weights where the INT4 kernel runs:
        silu(gate) * up [..., out_local / 2] from one launch (SiLU-and-mul in its epilogue); else None."""
        scales, zeros = self.weight_scales, self.weight_zeros
        if scales is None or zeros is None or not int4_gemm_fused(x, self.weight):
            return None
        return int4_gemm(x, self.weight, scales, zeros, self.bias, gated=True)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        raise NotImplementedError

    def quantize_fp8_block(self) -> None:
        """Replace the loaded weight by its block-wise FP8 form (128 x 128 blocks of the local shard)."""
        w_q, scale_inv = quantize_fp8_block(self.weight.data)
        self.weight = nn.Parameter(w_q, requires_grad=False)
        # a plain attribute, not a buffer: the class default keeps the unquantized path's lookup a fast one; the
        # model is already on its device here, and the scales are made on the weight's
        self.weight_scale_inv = scale_inv

    def expect_int4_checkpoint(self) -> None:
        """Before an INT4 checkpoint loads: the weight parameter gives way to `qweight`, `scales` and `qzeros` in
        the canonical layout of this rank's shard, each with this layer's weight_loader."""
        out_local, in_local = self.weight.shape
        self._check_int4_groups()
        device = self.weight.device
        del self.weight
        for name, shape, dtype in (("qweight", (out_local, in_local), torch.uint8),
                                   ("scales", (out_local, in_local // GROUP), torch.float32),
                                   ("qzeros", (out_local, in_local // GROUP), torch.uint8)):
            param = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
            set_weight_loader(param, self.weight_loader)
            self.register_parameter(name, param)

    def pack_int4(self) -> None:
        """After the INT4 checkpoint loaded: the canonical tensors packed into the kernel's layout. Scales stay
        float16 when that holds them exactly (as AWQ / GPTQ store them), else float32."""
        codes, scales, zeros = self.get_parameter("qweight"), self.get_parameter("scales"), self.get_parameter("qzeros")
        for name in ("qweight", "scales", "qzeros"):
            delattr(self, name)
        narrow = scales.data.half()
        self._set_int4(codes.data, narrow if torch.equal(narrow.float(), scales.data) else scales.data, zeros.data)

    def quantize_int4(self) -> None:
        """Replace the loaded float weight by INT4 codes (round to nearest, groups of 128 inputs of the local shard,
        float16 scales)."""
        self._check_int4_groups()
        self._set_int4(*quantize_int4(self.weight.data))

    def _check_int4_groups(self) -> None:
        in_local = self.weight.shape[1]
        if in_local % GROUP:
            raise ValueError(f"{type(self).__name__}: INT4 weights need whole groups of {GROUP} inputs per rank; "
                             f"this rank holds {in_local} inputs (a tensor-parallel size that leaves whole groups, "
                             "or a model whose widths are multiples of 128)")

    def _set_int4(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        qweight, scales_t, zeros_t = pack_int4_weight(codes, scales, zeros)
        self.weight = nn.Parameter(qweight, requires_grad=False)
        # plain attributes, as weight_scale_inv: made on the weight's device, after the model was placed
        self.weight_scales, self.weight_zeros = scales_t, zeros_t


class ReplicatedLinear(LinearBase):
    """The full layer on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        copy_checked(param.data, read_full(loaded_weight), "ReplicatedLinear")


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication (the output stays sharded)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        out_local = divide(output_size, get_tp_size(), "output size of a column-parallel layer")
        super().__init__(input_size, out_local, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        size = param.shape[0]
        check_shape(loaded_weight, (size * self.tp_size, *param.shape[1:]), "ColumnParallelLinear")
        copy_checked(param.data, read_shard(loaded_weight, 0, self.tp_rank * size, size), "ColumnParallelLinear")


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel layers side by side (e.g. gate and up); shard ids 0, 1, ..."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        tp = get_tp_size()
        self.local_sizes = [divide(s, tp, "output size of a merged column-parallel layer") for s in output_sizes]
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        if shard_id is None:  # an already fused checkpoint tensor: split it into its parts
            check_shape(loaded_weight, (sum(self.output_sizes), *param.shape[1:]), "MergedColumnParallelLinear")
            full = read_full(loaded_weight)
            starts = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]
            for i, (start, size) in enumerate(zip(starts, self.output_sizes, strict=True)):
                self.weight_loader(param, full.narrow(0, start, size), i)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.local_sizes):
            raise ValueError(f"MergedColumnParallelLinear: shard id {shard_id!r} not in 0..{len(self.local_sizes) - 1}")
        size = self.local_sizes[shard_id]
        check_shape(loaded_weight, (self.output_sizes[shard_id], *param.shape[1:]), f"merged shard {shard_id}")
        dst = param.data.narrow(0, sum(self.local_sizes[:shard_id]), size)
        copy_checked(dst, read_shard(loaded_weight, 0, self.tp_rank * size, size), f"merged shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection split by heads; shard ids "q", "k", "v".

    Local output layout: [q heads of this rank | k heads | v heads]. When there are fewer KV heads
    than ranks, each KV head is replicated on tp_size // num_kv_heads ranks (as vLLM does).
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False) -> None:
        tp = get_tp_size()
        self.head_size = head_size
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if total_num_kv_heads >= tp:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "num_key_value_heads")
            self.kv_replicas = 1
        else:
            if tp % total_num_kv_heads != 0:
                raise ValueError(f"the tensor-parallel size ({tp}) is not a multiple of num_key_value_heads "
                                 f"({total_num_kv_heads})")
            self.num_kv_heads, self.kv_replicas = 1, tp // total_num_kv_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        out_total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp
        super().__init__(hidden_size, out_total, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        q_total = self.total_num_heads * self.head_size
        kv_total = self.total_num_kv_heads * self.head_size
        if shard_id is None:  # an already fused checkpoint tensor [q_total | k_total | v_total]
            check_shape(loaded_weight, (q_total + 2 * kv_total, *param.shape[1:]), "QKVParallelLinear")
            full = read_full(loaded_weight)
            for sid, start, size in (("q", 0, q_total), ("k", q_total, kv_total), ("v", q_total + kv_total, kv_total)):
                self.weight_loader(param, full.narrow(0, start, size), sid)
            return
        kv_rank = self.tp_rank // self.kv_replicas
        layout = {"q": (0, self.q_size, self.tp_rank * self.q_size),
                  "k": (self.q_size, self.kv_size, kv_rank * self.kv_size),
                  "v": (self.q_size + self.kv_size, self.kv_size, kv_rank * self.kv_size)}
        if shard_id not in layout:
            raise ValueError(f"QKVParallelLinear: shard id {shard_id!r} is not 'q', 'k' or 'v'")
        offset, size, src_start = layout[shard_id]
        check_shape(loaded_weight, (q_total if shard_id == "q" else kv_total, *param.shape[1:]),
                    f"qkv shard {shard_id}")
        dst = param.data.narrow(0, offset, size)
        copy_checked(dst, read_shard(loaded_weight, 0, src_start, size), f"qkv shard {shard_id}")


class RowParallelLinear(LinearBase):
    """Input features split across ranks (input already sharded); outputs summed by all-reduce.

    The bias is replicated and added once, after the all-reduce.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        in_local = divide(input_size, get_tp_size(), "input size of a row-parallel layer")
        super().__init__(in_local, output_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = tp_all_reduce(self.matmul(x, None))
        return y if self.bias is None else y + self.bias

    def weight_loader(self, param: nn.Parameter, loaded_weight: WeightLike, shard_id=None) -> None:
        if param.dim() == 1:  # bias: full copy on every rank
            copy_checked(param.data, read_full(loaded_weight), "RowParallelLinear bias")
            return
        size = param.shape[1]
        check_shape(loaded_weight, (param.shape[0], size * self.tp_size), "RowParallelLinear")
        copy_checked(param.data, read_shard(loaded_weight, 1, self.tp_rank * size, size), "RowParallelLinear")


__all__ = ["LinearBase", "ReplicatedLinear", "ColumnParallelLinear", "MergedColumnParallelLinear",
           "QKVParallelLinear", "RowParallelLinear"]
