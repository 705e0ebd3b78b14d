"""Launch choices of the Triton paged decode (triton_decode.decode_attention): splits per sequence and tokens
per KV tile, from static facts only (batch, heads, max_seqlen_k, block size), so CUDA graphs stay valid. The
numbers are H200 measurements (benchmarks/bench_decode_attention.py).
"""
from __future__ import annotations

import torch

from nv_kernels.sm_count import cuda_sm_count


def num_sms(device: torch.device) -> int:
    """The device's SM count (4 off CUDA: the interpreter's tests get several splits)."""
    count = cuda_sm_count(device)
    return 4 if count is None else count


# Tunables (set by benchmarks/bench_decode_attention.py measurements on the H200, 2026-11-29: batch 256 x
# context 1024 reads KV at 97-100% of the copy bandwidth for block sizes 16..256). One split from 2 programs
# per SM: re-measured 2026-12-01 in CUDA graphs with the merge, Qwen3-0.6B heads, block 64, contexts 0.6-1.4x
# of 400 and 1,024: batch 48 and 64 fastest at one split (two: +3-6 us per layer, the merge kernel and the
# partial sums' round trip); batch 16 and 32 keep the programs rule below.
PROGRAMS_PER_SM = 4  # stage-1 programs wanted per SM before splitting stops
ONE_SPLIT_PROGRAMS_PER_SM = 2  # from this many (sequence, KV head) programs per SM on, never split
MIN_TOKENS_PER_SPLIT = 256  # a split should stream at least this much context
MAX_SPLITS = 32
# An FP8 cache (128-token tiles, 128 registers: 4 programs resident per SM) reads a sequence's context in half the
# time of bf16, so uneven contexts leave SMs idle at the end of a wave sooner: it splits up to more programs.
# One H100, contexts uniform in [c/2, 3c/2] (`benchmarks/bench_kv_fp8.py decode-bw --sweep --ragged --tiles 128`):
# 64 x 4,096 reads at 83.0% of the copy bandwidth with 4 splits against 76.5% with one; 256 x 1,024 is fastest
# at one split.
FP8_PROGRAMS_PER_SM = 16
FP8_ONE_SPLIT_PROGRAMS_PER_SM = 8


def choose_num_splits(batch: int, num_kv_heads: int, max_seqlen_k: int, num_sms: int, fp8: bool = False) -> int:
    """Splits per sequence from static facts only (never runtime seq_lens): CUDA-graph safe. One
    split needs no merge kernel. fp8: the cache is FP8 (its own thresholds, above)."""
    programs = max(1, batch * num_kv_heads)
    one_split, per_sm = ((FP8_ONE_SPLIT_PROGRAMS_PER_SM, FP8_PROGRAMS_PER_SM) if fp8
                         else (ONE_SPLIT_PROGRAMS_PER_SM, PROGRAMS_PER_SM))
    if programs >= one_split * num_sms:
        return 1
    wanted = -(-per_sm * num_sms // programs)
    by_length = max(1, max_seqlen_k // MIN_TOKENS_PER_SPLIT)
    splits = max(1, min(wanted, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)  # a power of two: fewer kernel variants


def fused_decode_rope_pays(batch: int, num_kv_heads: int, max_seqlen_k: int, device: torch.device,
                           fp8: bool = False) -> bool:
    """Whether a decode of this shape should finish q and k itself (triton_decode.decode_attention's rope)
    rather than leave them to the separate norm + rotary + store kernel (fused_rope). Only with more than one
    split: with one, every program owns a new token, and its store and the barrier before its first read cost
    more than the separate kernel (H200, Qwen3-0.6B heads, context 1,024, in CUDA graphs: batch 128 137.3 us
    per layer fused against 130.0 separate). Static facts only, as choose_num_splits: CUDA-graph safe."""
    return choose_num_splits(batch, num_kv_heads, max_seqlen_k, num_sms(device), fp8) > 1


def query_tile_rows(group: int, fp8: bool = False) -> int:
    """Rows of a decode program's query tile: its `group` query heads padded to a power of two, at least 16 with a
    16-bit cache and 8 with an FP8 one. The tensor cores multiply 16 rows either way (Triton pads the tile), but the
    loop around them differs: compiled for sm_90 (`scripts/dev/kernel_sass.py decode --fp8 --group-pad 8`), an
    FP8 loop at 8 rows takes 4.24 instructions per KV token per thread against 5.08 at 16, in the same 128
    registers; a bf16 loop takes more at 8 rows (4.94 against 4.03)."""
    return max(8 if fp8 else 16, 1 << (group - 1).bit_length())


def choose_tile(block_size: int, head_dim: int, fp8: bool = False) -> int:
    """Tokens per KV tile (measured on the H200, D 128: bf16 64 for block sizes >= 32, 32 for 16). An FP8
    cache takes 128 for block sizes >= 32: at 64 tokens its tiles carry half the bytes for the same per-tile
    work (H200, batch 256 x context 1,024, block size 64: 75.7% of the copy bandwidth at 128 against 64.2% at
    64). 256 read a little faster where every context is a whole number of tiles (H200 77.7%), but the engine's
    contexts end anywhere, and a partial last tile is read in full: with contexts uniform in [c/2, 3c/2]
    (`benchmarks/bench_kv_fp8.py decode-bw --sweep --ragged`, one H100) 128 reads at 84.6% against 78.4% for 256
    at batch 256 x 1,024, and the headline runs 11% faster (30,094 against 26,985 output tok/s warm).

    A tile inside one page loads from one page base; a tile wider than the page gathers its pages.
    """
    if head_dim > 128:
        return 32
    if block_size < 32:
        return 32
    return 128 if fp8 else 64
