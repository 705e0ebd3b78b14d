"""Token sampling on the device, with no host sync.

Per row: a structured-output grammar's token bitmask, allowed ids, banned ids (min_tokens, bad words)
and logit bias, then penalties (vLLM's presence / frequency / repetition), then greedy
rows (temperature 0) take the argmax; the others are scaled by temperature, filtered by min-p, then
top-k and top-p (vLLM v1's order), and sampled by the exponential race: argmax(p / E) with E ~ Exp(1),
done in log space as argmax(logits / T - log E) (the Gumbel-max form of the same draw). The noise comes from a
counter-based integer hash of (seed, position, token id) in int64 torch ops (nv_kernels.sampler_hash),
so a seeded row draws the same token whatever batch, row or device-step it runs in.

Which stages run is decided by Python flags in `SamplingTensors` (set by the engine from the
requests' parameters), never by tensor values, so a step never waits on the device. On CUDA a
step with temperature-only sampling (no penalties, bans, filters or logprobs; a grammar's bitmask
at most) skips the torch stages: nv_kernels.sampler_kernel draws from the raw (bf16) logits in two
launches, reading the bitmask there.
Ideas from vLLM's sampler (penalty semantics, sort-based top-k/top-p) and Gumbel-max sampling.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor, nn

from nv_kernels.sampler_hash import gumbel_noise, row_keys, token_keys
from nv_kernels.sampler_hash import uniform_from_bits as uniform_from_bits  # re-exported: part of the draw

# Above this many top-k candidates a full sort is cheaper than torch.topk.
_TOPK_SORT_THRESHOLD = 1024


@dataclass
class SamplingTensors:
    """Per-step sampling inputs, all on the logits' device; `S` rows, one per sampling sequence."""

    temperatures: Tensor  # [S] float32; 0 = greedy
    top_k: Tensor  # [S] int32/int64; 0 or >= V = off
    top_p: Tensor  # [S] float32; 1 = off
    min_p: Tensor  # [S] float32; 0 = off
    seeds: Tensor  # [S] int64
    positions: Tensor  # [S] int64; index of the token being sampled (output count)
    num_logprobs: int = 0  # max top-k logprobs wanted in the batch (0 = none)
    need_logprobs: bool = False  # chosen-token logprob / rank wanted even when num_logprobs == 0
    presence_penalties: Tensor | None = None  # [S] float32; 0 = off
    frequency_penalties: Tensor | None = None  # [S] float32; 0 = off
    repetition_penalties: Tensor | None = None  # [S] float32; 1 = off
    prompt_token_ids: Tensor | None = None  # [S, Lp] int64, padded with V (repetition penalty)
    output_token_ids: Tensor | None = None  # [S, Lo] int64, padded with V (all penalties)
    banned_token_ids: Tensor | None = None  # [S, Lb] int64, padded with V; -inf (min_tokens, bad words)
    allowed_token_ids: Tensor | None = None  # [S, La] int64, padded with V; the rest -inf (all pad: no limit)
    logit_bias_ids: Tensor | None = None  # [S, Lg] int64, padded with V ...
    logit_bias_values: Tensor | None = None  # [S, Lg] float32 ... added to those logits (0 on padding)
    # [S, ceil(V/32)] int32: bit j of word w allows token 32w + j (a grammar's); the rest -inf
    token_bitmask: Tensor | None = None
    # Python-side flags; the defaults are the safe (do every stage) choice.
    all_greedy: bool = False
    any_greedy: bool = True
    any_top_k: bool = True
    any_top_p: bool = True
    any_min_p: bool = True
    max_top_k: int | None = None  # largest active top_k in the batch (None: unknown, sort instead)

    @property
    def any_logits_processing(self) -> bool:
        """Anything that edits the logits before penalties (grammar bitmask, allowed ids, bans, bias)."""
        return (self.allowed_token_ids is not None or self.banned_token_ids is not None
                or self.logit_bias_ids is not None or self.token_bitmask is not None)

    @property
    def any_penalties(self) -> bool:
        return self.repetition_penalties is not None or self.presence_penalties is not None or (
            self.frequency_penalties is not None)


class SamplerOutput(NamedTuple):
    token_ids: Tensor  # [S] int64
    logprobs: Tensor | None  # [S] float32, raw log_softmax of the chosen token
    topk_ids: Tensor | None  # [S, K] int64
    topk_logprobs: Tensor | None  # [S, K] float32
    ranks: Tensor | None  # [S] int64; 1 = most likely


def _id_mask(ids: Tensor, vocab_size: int) -> Tensor:
    """[S, L] ids padded with vocab_size -> [S, V] bool, True where the id occurs."""
    mask = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    mask.scatter_(1, ids, True)
    return mask[:, :vocab_size]


def bitmask_allows(bitmask: Tensor, vocab_size: int) -> Tensor:
    """[S, W] int32 packed bits -> [S, V] bool, True where bit (id % 32) of word id // 32 is set."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask[:, :, None] >> shifts) & 1  # [S, W, 32]; >> is arithmetic, & 1 keeps the bit
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_constraints(logits: Tensor, t: SamplingTensors) -> Tensor:
    """A grammar's token bitmask (-inf where not allowed), allowed ids (rows with a list keep only
    those), banned ids (-inf) and logit bias (added), in vLLM's order, before penalties and
    temperature. Returns a new tensor."""
    num_rows, vocab = logits.shape
    if t.token_bitmask is not None:
        logits = logits.masked_fill(~bitmask_allows(t.token_bitmask, vocab), float("-inf"))
    if t.allowed_token_ids is not None:
        allowed = _id_mask(t.allowed_token_ids, vocab)  # [S, V]
        limited = allowed.any(dim=-1, keepdim=True)  # [S, 1]; rows without a list keep all ids
        logits = logits.masked_fill(limited & ~allowed, float("-inf"))
    if t.banned_token_ids is not None:
        logits = logits.masked_fill(_id_mask(t.banned_token_ids, vocab), float("-inf"))
    if t.logit_bias_ids is not None and t.logit_bias_values is not None:
        bias = torch.zeros(num_rows, vocab + 1, dtype=logits.dtype, device=logits.device)
        bias.scatter_add_(1, t.logit_bias_ids, t.logit_bias_values.to(logits.dtype))
        logits = logits + bias[:, :vocab]
    return logits


def apply_penalties(logits: Tensor, t: SamplingTensors) -> Tensor:
    """vLLM semantics: repetition divides positive / multiplies negative logits of tokens seen in
    the prompt or the output; frequency subtracts count * f, presence subtracts p, over the output."""
    num_rows, vocab = logits.shape
    out_ids = t.output_token_ids
    if out_ids is None:
        out_ids = torch.full((num_rows, 1), vocab, dtype=torch.int64, device=logits.device)
    counts = torch.zeros(num_rows, vocab + 1, dtype=logits.dtype, device=logits.device)
    counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=logits.dtype))
    counts = counts[:, :vocab]  # [S, V]
    out_mask = counts > 0
    if t.repetition_penalties is not None:
        seen = out_mask
        if t.prompt_token_ids is not None:
            seen = seen | _id_mask(t.prompt_token_ids, vocab)
        rep = t.repetition_penalties.to(logits.dtype)[:, None]  # [S, 1]
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    if t.frequency_penalties is not None:
        logits = logits - t.frequency_penalties.to(logits.dtype)[:, None] * counts
    if t.presence_penalties is not None:
        logits = logits - t.presence_penalties.to(logits.dtype)[:, None] * out_mask
    return logits


def apply_top_k_top_p(logits: Tensor, t: SamplingTensors) -> Tensor:
    """Mask (to -inf) tokens outside each row's top-k / top-p set; rows with both off untouched.
    May modify `logits` in place; returns the result."""
    vocab = logits.shape[1]
    top_k = t.top_k.to(torch.int64)
    k_on = (top_k > 0) & (top_k < vocab)  # [S]
    max_top_k = t.max_top_k
    if t.any_top_k and not t.any_top_p and max_top_k is not None and max_top_k <= _TOPK_SORT_THRESHOLD:
        kk = max(1, min(int(max_top_k), vocab))
        top_vals = logits.topk(kk, dim=-1).values  # [S, kk] descending
        kth = top_vals.gather(1, (top_k.clamp(1, kk) - 1)[:, None])  # [S, 1]
        kth = torch.where(k_on[:, None], kth, torch.full_like(kth, float("-inf")))
        return logits.masked_fill_(logits < kth, float("-inf"))
    sorted_logits, order = logits.sort(dim=-1)  # ascending, [S, V]
    if t.any_top_k:
        k_eff = torch.where(k_on, top_k, torch.full_like(top_k, vocab))
        kth = sorted_logits.gather(1, (vocab - k_eff)[:, None])  # [S, 1]
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    if t.any_top_p:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum_(dim=-1)  # [S, V]; tail mass up to and including each token
        top_p = t.top_p.to(cum.dtype)
        drop = (cum <= (1.0 - top_p)[:, None]) & (top_p < 1.0)[:, None]
        drop[:, -1] = False  # always keep the most likely token
        sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)


def apply_min_p(logits: Tensor, min_p: Tensor) -> Tensor:
    """Drop tokens with p < min_p * p_max, i.e. logit < max_logit + log(min_p); min_p 0 keeps all."""
    threshold = logits.amax(dim=-1, keepdim=True) + torch.log(min_p.to(logits.dtype))[:, None]
    return logits.masked_fill_(logits < threshold, float("-inf"))


def compute_logprobs(logits: Tensor, token_ids: Tensor, num_logprobs: int
                     ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Raw log_softmax: chosen token's logprob [S], its rank [S] and the top-`num_logprobs`."""
    logprobs = torch.log_softmax(logits, dim=-1)  # [S, V]
    chosen = logprobs.gather(1, token_ids[:, None])  # [S, 1]
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [S] int64
    topk_ids = topk_logprobs = None
    if num_logprobs > 0:
        topk_logprobs, topk_ids = logprobs.topk(min(num_logprobs, logits.shape[1]), dim=-1)
    return chosen.squeeze(1), ranks, topk_ids, topk_logprobs


def _load_fused_module() -> ModuleType | None:
    try:
        import nv_kernels.sampler_kernel as module
    except Exception:  # noqa: BLE001 - no triton (or it cannot build here): torch path
        return None
    return module


def fast_path_applies(t: SamplingTensors) -> bool:
    """True when a step needs nothing but temperature (or greedy) sampling, under a grammar's token
    bitmask at most: no penalties, bans, bias, filters or logprobs. Then the fused kernel reads the
    logits once, in their own dtype (and the bitmask)."""
    if t.any_penalties or t.need_logprobs or t.num_logprobs > 0:
        return False
    if t.allowed_token_ids is not None or t.banned_token_ids is not None or t.logit_bias_ids is not None:
        return False
    return t.all_greedy or not (t.any_top_k or t.any_top_p or t.any_min_p)


class Sampler(nn.Module):
    """forward(logits [S, V], SamplingTensors) -> SamplerOutput; no host sync.

    use_triton: draw with the fused Triton kernels (nv_kernels.sampler_kernel) on CUDA; None = when
    triton imports. The torch path is the reference and runs everywhere else. With the kernels, a
    step that passes `fast_path_applies` is two launches on the raw logits (no fp32 copy, no
    separate temperature pass); other steps run the torch stages, then the kernels' draw.
    """

    def __init__(self, use_triton: bool | None = None) -> None:
        super().__init__()
        self._token_keys: Tensor | None = None
        self.use_triton = use_triton
        self._fused: ModuleType | None = None

    def token_keys(self, vocab_size: int, device: torch.device) -> Tensor:
        cached = self._token_keys
        if cached is None or cached.shape[0] != vocab_size or cached.device != device:
            cached = self._token_keys = token_keys(vocab_size, device)
        return cached

    def _fused_kernels(self, device: torch.device) -> ModuleType | None:
        if self.use_triton is False or device.type != "cuda":
            return None
        if self._fused is None:
            self._fused = _load_fused_module()
            if self._fused is None and self.use_triton:
                raise RuntimeError("Sampler(use_triton=True) needs triton (nv_kernels.sampler_kernel)")
        return self._fused

    def forward(self, logits: Tensor, t: SamplingTensors) -> SamplerOutput:
        if logits.dim() != 2:
            raise ValueError(f"logits must be [S, V], got shape {tuple(logits.shape)}")
        fused = self._fused_kernels(logits.device)
        if fused is not None and fast_path_applies(t):
            token_ids = fused.sample_tokens(logits, t.seeds, t.positions, t.temperatures,
                                            all_greedy=t.all_greedy, token_bitmask=t.token_bitmask)
            return SamplerOutput(token_ids, None, None, None, None)
        if logits.dtype != torch.float32:
            logits = logits.float()
        raw = logits
        if t.any_logits_processing:
            logits = apply_token_constraints(logits, t)
        if t.any_penalties:
            logits = apply_penalties(logits, t)
        if t.all_greedy:
            token_ids = logits.argmax(dim=-1)
        else:
            token_ids = self._sample(logits, t, fused)
        if not (t.need_logprobs or t.num_logprobs > 0):
            return SamplerOutput(token_ids, None, None, None, None)
        chosen, ranks, topk_ids, topk_logprobs = compute_logprobs(raw, token_ids, t.num_logprobs)
        return SamplerOutput(token_ids, chosen, topk_ids, topk_logprobs, ranks)

    def _sample(self, logits: Tensor, t: SamplingTensors, fused: ModuleType | None) -> Tensor:
        temps = t.temperatures.to(logits.dtype)
        greedy = temps <= 0.0  # [S]
        greedy_ids = logits.argmax(dim=-1) if t.any_greedy else None
        if t.any_greedy:
            temps = torch.where(greedy, torch.ones_like(temps), temps)
        scaled = logits / temps[:, None]  # new tensor: later stages may work in place
        if t.any_min_p:  # before top-k / top-p, as vLLM v1 (min-p is a logits processor there)
            scaled = apply_min_p(scaled, t.min_p)
        if t.any_top_k or t.any_top_p:
            scaled = apply_top_k_top_p(scaled, t)
        if fused is not None:  # hashes in the kernel; every row gets noise (scores already scaled)
            sampled = fused.sample_tokens(scaled, t.seeds, t.positions)
        else:
            keys = row_keys(t.seeds, t.positions)  # [S]
            tok_keys = self.token_keys(scaled.shape[1], scaled.device)  # [V]
            sampled = scaled.add_(gumbel_noise(keys, tok_keys)).argmax(dim=-1)  # [S]
        if greedy_ids is None:
            return sampled
        return torch.where(greedy, greedy_ids, sampled)
