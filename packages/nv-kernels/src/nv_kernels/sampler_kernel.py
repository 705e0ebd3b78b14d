"""Fused Gumbel-max draw for the sampler on CUDA: logits (bf16 / fp16 / fp32) read once.

Stage 1 splits each row's vocabulary over several programs (`num_chunks` per row, so a batch of
256 rows fills the GPU instead of running 256 long programs); each program converts its logits to
fp32, divides by the row's temperature, adds the hash noise, and writes its (best value, first
index) pair. Stage 2 reduces the per-chunk pairs of each row. A row with temperature <= 0 takes
the argmax of the raw logits (no noise). Row keys (from seed and position) and token keys are
computed in the kernel, so the common path is two launches. A structured-output token bitmask
([S, ceil(V/32)] int32, bit j of word w allows token 32w + j) is read in stage 1: a token it does
not allow is -inf, as the torch path's masked_fill makes it.

Bit-exactness with the torch reference (sampler_hash.sample_tokens_torch): the hash is the same uint32 arithmetic
(uint32 wraps mod 2**32, the torch path masks to 32 bits); the division is IEEE round-to-nearest
(div_rn, like torch's `/`); only `log` may differ in the last ulp, so a near-tie can rarely pick the
other token. Ties go to the smallest index (torch.argmax's first occurrence): strict `>` within a
lane, then the smallest index among the lanes and the chunks holding the maximum.
"""
# Triton kernels: pyright cannot type @triton.jit calls (tl.constexpr parameters, launch options such as
# num_warps) or `tl`, which is None when triton is missing; the kernels are checked by their tests instead.
# pyright: reportInvalidTypeForm=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOptionalMemberAccess=false, reportOperatorIssue=false
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nv_kernels.sampler_hash import MUL1, MUL2, SEED_SALT, TOKEN_SALT

# The kernels spell the constants as literals (a global read inside @triton.jit must be a constexpr).
# Literals below 2**31 stay int32 in Triton; the salts are in [2**31, 2**32): uint32 literals.
if (MUL1, MUL2, SEED_SALT, TOKEN_SALT) != (0x7FEB352D, 0x31848BAB, 0x9E3779B9, 0x85EBCA6B):
    raise ImportError("nv_kernels.sampler_hash's constants differ from this kernel's literals")


@triton.jit
def _mix32(x):
    # x: uint32. Same finaliser as sampler_hash.mix32_.
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x31848BAB
    x ^= x >> 16
    return x


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min2(a, b):
    return tl.minimum(a, b)


@triton.jit
def _row_key(seeds_ptr, positions_ptr, row):
    # Same as sampler_hash.row_keys: low word, high word of the seed, then the position.
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    pos = tl.load(positions_ptr + row).to(tl.int64)
    key = _mix32(seed.to(tl.uint32) ^ 0x9E3779B9)
    key = _mix32(key ^ (seed >> 32).to(tl.uint32))
    return _mix32(key ^ pos.to(tl.uint32))


@triton.jit
def _chunk_argmax(row_ptr, mask_row_ptr, start, end, key, temp, NOISE: tl.constexpr, SCALE: tl.constexpr,
                  HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    """(max value, its first index) of logits[start:end] (/ temp + noise when NOISE; -inf where the
    bitmask row clears the token's bit, when HAS_MASK)."""
    lanes = tl.arange(0, BLOCK)
    temps = tl.full([BLOCK], 0.0, tl.float32) + temp  # [BLOCK]: div_rn gets equal shapes
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = start + lanes  # a lane that never beats -inf keeps its first index
    for off in range(start, end, BLOCK):
        offs = off + lanes
        mask = offs < end
        val = tl.load(row_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if HAS_MASK:
            words = tl.load(mask_row_ptr + (offs >> 5), mask=mask, other=0)   # int32, 32 tokens each
            val = tl.where(((words >> (offs & 31)) & 1) != 0, val, float("-inf"))
        if NOISE:
            if SCALE:
                val = tl.math.div_rn(val, temps)
            tok = _mix32(offs.to(tl.uint32) ^ 0x85EBCA6B)  # sampler_hash.token_keys
            bits = _mix32(tok ^ key)
            u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # as uniform_from_bits
            val = val - tl.log(-tl.log(u))
        better = val > best_val  # strict: the first index wins within a lane
        best_val = tl.where(better, val, best_val)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.reduce(best_val, 0, _max2)
    idx = tl.reduce(tl.where(best_val == top, best_idx, end), 0, _min2)
    return top, idx


# Only builtins and our own jit helpers inside the kernels: triton.language's @jit helpers
# (tl.zeros, tl.max, ...) cannot run under TRITON_INTERPRET=1 once triton was imported without it.
@triton.jit(do_not_specialize=["num_chunks"])  # 8..64 by batch size: one variant for all
def _partial_kernel(logits_ptr, stride_row, temps_ptr, seeds_ptr, positions_ptr, mask_ptr, stride_mask,
                    part_val_ptr, part_idx_ptr, vocab, chunk, num_chunks, ALL_GREEDY: tl.constexpr,
                    SCALE: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    start = c * chunk
    end = tl.minimum(start + chunk, vocab)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    mask_row_ptr = mask_ptr + row.to(tl.int64) * stride_mask
    if ALL_GREEDY:
        top, idx = _chunk_argmax(row_ptr, mask_row_ptr, start, end, 0, 1.0, False, False, HAS_MASK, BLOCK)
    else:
        temp = 1.0
        if SCALE:
            temp = tl.load(temps_ptr + row).to(tl.float32)
        if temp > 0.0:
            key = _row_key(seeds_ptr, positions_ptr, row)
            top, idx = _chunk_argmax(row_ptr, mask_row_ptr, start, end, key, temp, True, SCALE, HAS_MASK, BLOCK)
        else:
            top, idx = _chunk_argmax(row_ptr, mask_row_ptr, start, end, 0, 1.0, False, False, HAS_MASK, BLOCK)
    tl.store(part_val_ptr + row * num_chunks + c, top)
    tl.store(part_idx_ptr + row * num_chunks + c, idx)


@triton.jit(do_not_specialize=["num_rows", "num_chunks"])  # vary with the batch: one variant for all
def _reduce_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_rows, num_chunks, vocab,
                   ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    cols = tl.arange(0, CHUNKS)  # [CHUNKS]
    mask = (rows < num_rows)[:, None] & (cols < num_chunks)[None, :]
    offs = rows[:, None] * num_chunks + cols[None, :]
    val = tl.load(part_val_ptr + offs, mask=mask, other=float("-inf"))  # [ROWS, CHUNKS]
    idx = tl.load(part_idx_ptr + offs, mask=mask, other=vocab)
    top = tl.reduce(val, 1, _max2)  # [ROWS]
    first = tl.reduce(tl.where(val == top[:, None], idx, vocab), 1, _min2)
    tl.store(out_ptr + rows, first.to(tl.int64), mask=rows < num_rows)


MAX_DEFAULT_CHUNKS = 64  # also the reduce kernel's CHUNKS: one compiled variant for every batch size


def default_num_chunks(num_rows: int, vocab: int, block: int) -> int:
    """Programs per row: about 4,096 programs in all (8-64 per row), at most one per block."""
    wanted = min(MAX_DEFAULT_CHUNKS, max(8, triton.cdiv(4096, max(num_rows, 1))))
    return max(1, min(wanted, triton.cdiv(vocab, block)))


def sample_tokens(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                  temperatures: torch.Tensor | None = None, *, all_greedy: bool = False,
                  token_bitmask: torch.Tensor | None = None, block: int = 1024,
                  num_chunks: int | None = None) -> torch.Tensor:
    """Gumbel-max draw per row: [S, V] logits (any float dtype) -> [S] int64 token ids.

    temperatures [S]: each row is divided by its temperature before the noise; rows <= 0 take
    argmax(logits). None: the logits are already scaled and every row gets noise.
    all_greedy: argmax of every row (no noise, temperatures not read).
    token_bitmask [S, ceil(V/32)] int32: only the tokens whose bit is set may be drawn. No host sync.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [S, V], got shape {tuple(logits.shape)}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    if vocab == 0:
        raise ValueError("logits have an empty vocabulary")
    chunks = num_chunks or default_num_chunks(num_rows, vocab, block)
    chunk = triton.cdiv(triton.cdiv(vocab, chunks), block) * block
    chunks = triton.cdiv(vocab, chunk)  # no empty chunk
    part_val = torch.empty(num_rows, chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(num_rows, chunks, dtype=torch.int32, device=logits.device)
    scale = temperatures is not None
    temps = temperatures if scale else seeds  # unread when SCALE is off
    has_mask = token_bitmask is not None
    if token_bitmask is not None and (token_bitmask.dtype != torch.int32 or token_bitmask.dim() != 2
                                      or token_bitmask.shape[0] != num_rows
                                      or token_bitmask.shape[1] * 32 < vocab):
        raise ValueError(f"token_bitmask must be [{num_rows}, >= {triton.cdiv(vocab, 32)}] int32, got "
                         f"{tuple(token_bitmask.shape)} {token_bitmask.dtype}")
    if token_bitmask is not None and token_bitmask.stride(1) != 1:
        token_bitmask = token_bitmask.contiguous()
    mask = token_bitmask if token_bitmask is not None else seeds  # unread when HAS_MASK is off
    _partial_kernel[(num_rows, chunks)](
        logits, logits.stride(0), temps, seeds, positions, mask, mask.stride(0), part_val, part_idx,
        vocab, chunk, chunks, ALL_GREEDY=all_greedy, SCALE=scale, HAS_MASK=has_mask, BLOCK=block,
        num_warps=4)
    rows_per_program = 16
    _reduce_kernel[(triton.cdiv(num_rows, rows_per_program),)](
        part_val, part_idx, out, num_rows, chunks, vocab, ROWS=rows_per_program,
        CHUNKS=max(MAX_DEFAULT_CHUNKS, triton.next_power_of_2(chunks)), num_warps=4)
    return out
