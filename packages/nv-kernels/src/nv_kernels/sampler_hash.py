"""The sampler's counter-based noise in torch: the reference of `sampler_kernel`, and the hash constants
both share.

A row key comes from (seed, position), a token key from the token id; Gumbel noise -log(-log U) uses U
from the mixed pair, so a seeded row draws the same token whatever batch, row or device it runs in. All
arithmetic is uint32 held in int64 (masked to 32 bits after each multiply), so the Triton kernel's
wrapping uint32 ops give the same bits.
"""
from __future__ import annotations

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
# Multipliers below 2**31 keep (x < 2**32) * C below 2**63: no int64 overflow anywhere.
MUL1 = 0x7FEB352D
MUL2 = 0x31848BAB
SEED_SALT = 0x9E3779B9
TOKEN_SALT = 0x85EBCA6B


def mix32_(x: Tensor) -> Tensor:
    """A 32-bit integer finaliser (xorshift-multiply, after C. Wellons' lowbias32) on int64 values
    in [0, 2**32), in place; every intermediate stays below 2**63."""
    x.bitwise_xor_(x >> 16)
    x.mul_(MUL1).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(MUL2).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> 16)
    return x


def mix32(x: Tensor) -> Tensor:
    return mix32_(x.clone())


def row_keys(seeds: Tensor, positions: Tensor) -> Tensor:
    """[S] int64 keys in [0, 2**32) from (seed, position); any int64 seed."""
    seeds = seeds.to(torch.int64)
    key = mix32((seeds & MASK32) ^ SEED_SALT)
    key = mix32(key ^ ((seeds >> 32) & MASK32))
    return mix32(key ^ (positions.to(torch.int64) & MASK32))


def token_keys(vocab_size: int, device: torch.device | str) -> Tensor:
    """[V] int64 per-token keys in [0, 2**32) (distinct: mix32 is a bijection)."""
    ids = torch.arange(vocab_size, device=device, dtype=torch.int64)
    return mix32(ids ^ TOKEN_SALT)


def uniform_from_bits(x: Tensor) -> Tensor:
    """int64 values in [0, 2**32) -> float32 U strictly inside (0, 1): the top 23 bits plus a half
    step ((m + 0.5) / 2**23 needs 24 significant bits, exact in float32; 24 bits would round the
    largest value up to exactly 1.0, and log(-log 1) is -inf)."""
    return (x >> 9).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 23))


def gumbel_noise(keys: Tensor, tok_keys: Tensor) -> Tensor:
    """[S, V] float32 Gumbel noise -log(E), E = -log(U) ~ Exp(1), U from hash(row key, token key)."""
    u = uniform_from_bits(mix32_(keys[:, None] ^ tok_keys[None, :]))  # [S, V]
    return u.log_().neg_().log_().neg_()


def sample_tokens_torch(logits: Tensor, seeds: Tensor, positions: Tensor,
                        temperatures: Tensor | None = None, *, all_greedy: bool = False) -> Tensor:
    """The torch reference of `sampler_kernel.sample_tokens`: [S, V] logits -> [S] int64 token ids.

    temperatures [S]: rows are divided by their temperature before the noise; rows <= 0 take
    argmax(logits). None: the logits are already scaled and every row gets noise.
    all_greedy: argmax of every row.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [S, V], got shape {tuple(logits.shape)}")
    scores = logits.float()
    greedy_ids = scores.argmax(dim=-1)  # [S]
    if all_greedy:
        return greedy_ids
    if temperatures is None:
        greedy = torch.zeros_like(greedy_ids, dtype=torch.bool)
    else:
        temps = temperatures.to(torch.float32)
        greedy = temps <= 0.0  # [S]
        scores = scores / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    noise = gumbel_noise(row_keys(seeds, positions), token_keys(scores.shape[1], scores.device))
    sampled = (scores + noise).argmax(dim=-1)  # [S]
    return torch.where(greedy, greedy_ids, sampled)
