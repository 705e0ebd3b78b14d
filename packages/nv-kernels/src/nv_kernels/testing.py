"""Helpers for tests (here and in other packages): random paged-KV batches, a dense reference, and Triton
kernel modules imported for the interpreter."""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from nv_kernels import envs


@dataclass
class PagedBatch:
    """A random batch whose K/V already sit in a paged cache at shuffled block ids."""

    q: Tensor  # [T, Hq, D], sequence b's rows are cu_seqlens_q[b]:cu_seqlens_q[b+1]
    keys: list[Tensor]  # per sequence [L_b, Hkv, D]
    values: list[Tensor]  # per sequence [L_b, Hkv, D]
    k_cache: Tensor  # [NB, BS, Hkv, D]
    v_cache: Tensor  # [NB, BS, Hkv, D]
    block_tables: Tensor  # [B, M] int32 (unused entries hold random valid block ids)
    seq_lens: Tensor  # [B] int32
    cu_seqlens_q: Tensor  # [B+1] int32
    slot_mapping: Tensor  # [T] int64: the cache slots of each sequence's last q_len tokens
    max_seqlen_q: int
    max_seqlen_k: int


def random_paged_batch(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> PagedBatch:
    """Sequences of seq_lens[b] tokens, the last q_lens[b] of which are queries."""
    if len(seq_lens) != len(q_lens) or any(q > s for q, s in zip(q_lens, seq_lens, strict=True)):
        raise ValueError("need one q_len per sequence, each at most its seq_len")
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    width = max(1, max(blocks_per_seq))
    needed = sum(blocks_per_seq)
    if num_blocks is None:
        num_blocks = needed + 3
    if num_blocks < needed:
        raise ValueError(f"num_blocks {num_blocks} < {needed} blocks needed")
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Every slot no sequence owns (other blocks, the tail of a last block) holds NaN: a kernel that
    # reads outside a sequence's context poisons its output.
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    # Distinct blocks per sequence, from the high end of the pool to exercise large block ids.
    pool = min(num_blocks, max(2 * needed, 8))
    block_ids = torch.randperm(pool, generator=cpu_gen) + (num_blocks - pool)
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), generator=cpu_gen, dtype=torch.int32)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [NB*BS, Hkv, D]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    keys, values, slots, used = [], [], [], 0
    for b, (s, nblk) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        ids = block_ids[used:used + nblk]
        used += nblk
        tables[b, :nblk] = ids.to(torch.int32)
        tok = torch.arange(s)
        seq_slots = (ids[tok // block_size] * block_size + tok % block_size).to(device)  # [L]
        keys.append(torch.randn((s, num_kv_heads, head_dim), generator=gen, device=device).to(dtype))
        values.append(torch.randn((s, num_kv_heads, head_dim), generator=gen, device=device).to(dtype))
        k_flat[seq_slots] = keys[-1]
        v_flat[seq_slots] = values[-1]
        slots.append(seq_slots[s - q_lens[b]:])
    total_q = sum(q_lens)
    q = torch.randn((total_q, num_q_heads, head_dim), generator=gen, device=device).to(dtype)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    return PagedBatch(
        q=q,
        keys=keys,
        values=values,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=cu.to(device),
        slot_mapping=torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=device),
        max_seqlen_q=max(q_lens, default=0),
        max_seqlen_k=max(seq_lens, default=0),
    )


def dense_causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Naive float64 reference: q [Q, Hq, D] at the last Q positions of k/v [L, Hkv, D] -> [Q, Hq, D]."""
    nq, hq, _ = q.shape
    length, hkv, _ = k.shape
    k = k.double().repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
    v = v.double().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q.double(), k) * scale  # [Hq, Q, L]
    q_pos = torch.arange(length - nq, length)[:, None]
    mask = torch.arange(length)[None, :] <= q_pos  # [Q, L]
    scores = scores.masked_fill(~mask.to(scores.device), float("-inf"))
    return torch.einsum("hql,lhd->qhd", torch.softmax(scores, dim=-1), v)


def rotary_cos_sin(positions: int, dim: int, base: float = 10000.0, device: torch.device | str = "cpu") -> Tensor:
    """A NeoX rotary table [positions, dim] fp32, cos in the first half and sin in the second (the layout of
    nv_layers' cos_sin_cache), for kernels tested without the rotary module."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(positions).float(), inv_freq)             # [P, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)            # [P, D]


def compile_for_gpu(kernel: Any, args: tuple, kwargs: dict[str, Any], capability: int = 90) -> Any:
    """Compile a @triton.jit kernel (not interpreted) for an NVIDIA GPU of this compute capability from the
    arguments of one launch, without a GPU: Triton's front end, its passes and ptxas run on the host. Catches
    what the interpreter cannot (constexpr errors, types, layouts). Arguments are specialized as Triton's JIT
    specializes them at a launch (pointers and integers divisible by 16 marked so, an integer 1 a constant):
    without that the compiler sees no alignment, emits scalar loads and stages nothing in shared memory, and the
    variant differs from the one the GPU runs. Returns the compiled kernel."""
    import triton
    from triton._C.libtriton import native_specialize_impl as _specialize  # what a launch's binder calls
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", capability, 32)
    backend = CUDABackend(target)
    bound = dict(zip(kernel.arg_names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in kernel.arg_names})
    options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names and k != "launch_pdl"}
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, param in enumerate(kernel.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(i,)] = value
            continue
        kind, key = _specialize(CUDABackend, value, param.is_const, not param.do_not_specialize,
                                not param.do_not_specialize_on_alignment)
        signature[param.name] = kind
        if kind == "constexpr":                  # an integer 1 becomes a constant, as at a launch
            constexprs[(i,)] = value
        elif isinstance(key, str) and key:
            attrs[(i,)] = backend.parse_attr(key)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=target, options=options)


def relative_error(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@contextmanager
def interpreted_triton_modules(*names: str) -> Iterator[list[ModuleType]]:
    """Import the Triton kernel modules `names` with TRITON_INTERPRET=1 (on CPU, standing in for CUDA) and
    yield them. Triton decides interpretation when a kernel is defined, so a module this process already
    imported without the variable (compiled for the GPU) makes the caller's test skip."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        if envs.triton_interpret_value() is None and any(name in sys.modules for name in names):
            pytest.skip("the kernels were already compiled for the GPU in this process")
        mp.setenv("TRITON_INTERPRET", "1")
        yield [importlib.import_module(name) for name in names]


def fp8_code_agreement(got: Tensor, want: Tensor, chunk: int = 1 << 26) -> tuple[float, int]:
    """Compare two FP8 tensors code by code: (share of equal values, the largest distance between two
    codes in value order). FP8 formats are sign-magnitude, so a code's place in value order is
    +-(code & 0x7f) and +0 / -0 count as equal. Runs in chunks: a cache of billions of codes fits."""
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    equal, worst = 0, 0
    for start in range(0, g.numel(), chunk):
        a, b = _value_order(g[start:start + chunk]), _value_order(w[start:start + chunk])
        equal += int((a == b).sum())
        worst = max(worst, int((a - b).abs().max()))
    return equal / max(g.numel(), 1), worst


def _value_order(codes: Tensor) -> Tensor:
    signed = codes.to(torch.int16)
    magnitude = signed & 0x7F
    return torch.where(signed >= 0x80, -magnitude, magnitude)


SM90_SHARED_MEMORY = 227 * 1024     # the most shared memory one program may have on an H100 / H200


def ptxas_available() -> bool:
    """Whether triton carries its NVIDIA backend's ptxas, so kernels compile for a GPU on a machine without one."""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def run_compile_script(script: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run `script` (a compile test module run as a program) with Triton's compiler, not its interpreter, into the
    empty cache `cache_dir` (compile, never reuse a cached binary)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    return subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=900)
