"""Reference backend in plain PyTorch: exact (fp32 math), runs on any device. Used on CPU.

An FP8 cache is indexed through a uint8 view (CPU torch lacks some float8 indexing ops) and converted
with nv_kernels.kv_quant: K and V are dequantized to fp32 (fp8 * scale, the scale per tensor or per
(KV head, channel) broadcast over the tokens) before the attention math."""
from __future__ import annotations

import torch
from torch import Tensor

from nv_kernels.interface import check_query, check_store
from nv_kernels.kv_quant import check_scales, dequantize, is_fp8, quantize


def _bytes(cache: Tensor) -> Tensor:
    """The cache itself, or a uint8 view of an FP8 cache (same layout) for indexing."""
    return cache.view(torch.uint8) if is_fp8(cache.dtype) else cache


def _to_float(pages: Tensor, cache_dtype: torch.dtype, scale: Tensor | None) -> Tensor:
    """Gathered pages (uint8 bytes of an FP8 cache, or model dtype) -> fp32 values."""
    if is_fp8(cache_dtype) and scale is not None:
        return dequantize(pages.view(cache_dtype), scale)
    return pages.float()


def gather_pages(cache: Tensor, block_table: Tensor, num_tokens: int) -> Tensor:
    """[NB, BS, Hkv, D] cache, [M] block ids -> the first num_tokens tokens [num_tokens, Hkv, D]."""
    bs = cache.shape[1]
    num_blocks = (num_tokens + bs - 1) // bs
    pages = cache[block_table[:num_blocks].long()]  # [nblk, BS, Hkv, D]
    return pages.reshape(-1, cache.shape[2], cache.shape[3])[:num_tokens]


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q [Hq, Q, D], k/v [Hkv, L, D], mask [Q, L] (True = keep) -> [Hq, Q, D] in fp32.

    Query heads sharing a KV head are grouped: q head h uses KV head h // (Hq // Hkv).
    """
    hq, nq, d = q.shape
    hkv = k.shape[0]
    group = hq // hkv
    qg = q.float().reshape(hkv, group * nq, d)  # [Hkv, G*Q, D]
    scores = torch.bmm(qg, k.float().transpose(1, 2)) * scale  # [Hkv, G*Q, L]
    scores = scores.view(hkv, group, nq, -1).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # fully masked rows -> 0
    out = torch.bmm(probs.view(hkv, group * nq, -1), v.float())  # [Hkv, G*Q, D]
    return out.view(hq, nq, d)


class TorchBackend:
    """Gathers each sequence's pages and runs masked softmax attention in fp32."""

    name = "torch"

    def store_kvcache(
        self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, *,
        k_scale: Tensor | None = None, v_scale: Tensor | None = None,
    ) -> None:
        check_store(key, value, k_cache, v_cache, slot_mapping)
        check_scales(k_cache, k_scale, v_scale)
        nb, bs, hkv, d = k_cache.shape
        keep = slot_mapping >= 0  # [T]
        slots = slot_mapping[keep].long()
        block, offset = slots // bs, slots % bs
        if is_fp8(k_cache.dtype) and k_scale is not None and v_scale is not None:
            _bytes(k_cache)[block, offset] = quantize(key[keep], k_scale, k_cache.dtype).view(torch.uint8)
            _bytes(v_cache)[block, offset] = quantize(value[keep], v_scale, v_cache.dtype).view(torch.uint8)
            return
        k_cache[block, offset] = key[keep].to(k_cache.dtype)
        v_cache[block, offset] = value[keep].to(v_cache.dtype)

    def prefill(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        *,
        cu_seqlens_q: Tensor,
        seq_lens: Tensor,
        block_tables: Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        out = torch.empty_like(q)  # [T, Hq, D]
        starts = cu_seqlens_q.tolist()
        lens = seq_lens.tolist()
        for b, ctx_len in enumerate(lens):
            q_start, q_end = starts[b], starts[b + 1]
            q_len = q_end - q_start
            if q_len == 0:
                continue
            if q_len > ctx_len:
                raise ValueError(f"sequence {b}: {q_len} queries but context length {ctx_len}")
            k = _to_float(gather_pages(_bytes(k_cache), block_tables[b], ctx_len), k_cache.dtype,
                          k_scale).transpose(0, 1)  # [Hkv, L, D]
            v = _to_float(gather_pages(_bytes(v_cache), block_tables[b], ctx_len), v_cache.dtype,
                          v_scale).transpose(0, 1)
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)  # [Q]
            k_pos = torch.arange(ctx_len, device=q.device)  # [L]
            mask = k_pos[None, :] <= q_pos[:, None]  # [Q, L]
            o = attend(q[q_start:q_end].transpose(0, 1), k, v, mask, scale)  # [Hq, Q, D]
            out[q_start:q_end] = o.transpose(0, 1).to(q.dtype)
        return out

    def decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        *,
        seq_lens: Tensor,
        block_tables: Tensor,
        max_seqlen_k: int,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        hq, hkv = check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        nb, bs, _, d = k_cache.shape
        batch = q.shape[0]
        # Gather up to max_seqlen_k tokens for every row at once (no host sync), mask the tail.
        num_blocks = min(block_tables.shape[1], max(1, (max_seqlen_k + bs - 1) // bs))
        table = block_tables[:, :num_blocks].long().clamp(0, nb - 1)  # [B, M]
        length = num_blocks * bs
        keep = torch.arange(length, device=q.device)[None, :] < seq_lens[:, None].long()  # [B, L]
        outside = ~keep[:, :, None, None]  # slots past a row's context may hold anything (NaN too)
        k = _to_float(_bytes(k_cache)[table], k_cache.dtype, k_scale)
        k = k.reshape(batch, length, hkv, d).masked_fill_(outside, 0.0)  # [B, L, Hkv, D]
        v = _to_float(_bytes(v_cache)[table], v_cache.dtype, v_scale)
        v = v.reshape(batch, length, hkv, d).masked_fill_(outside, 0.0)
        qg = q.float().view(batch, hkv, hq // hkv, d)  # [B, Hkv, G, D]
        scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale  # [B, Hkv, G, L]
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # seq_len 0 rows -> 0
        out = torch.einsum("bhgl,blhd->bhgd", probs, v)  # [B, Hkv, G, D]
        return out.reshape(batch, hq, d).to(q.dtype)

    def decode_queries(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, *, seq_lens: Tensor, block_tables: Tensor,
        max_seqlen_k: int, scale: float, query_len: int, k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """q [B * Q, Hq, D] (Q = query_len tokens per sequence, the last one newest) -> [B * Q, Hq, D]; query token
        j of sequence b attends to positions < seq_lens[b] - Q + 1 + j (no host sync: CUDA-graph safe)."""
        hq, hkv = check_query(q, k_cache, v_cache)
        check_scales(k_cache, k_scale, v_scale)
        if query_len < 1 or q.shape[0] % query_len:
            raise ValueError(f"q has {q.shape[0]} rows: not whole sequences of query_len={query_len}")
        nb, bs, _, d = k_cache.shape
        batch = q.shape[0] // query_len
        num_blocks = min(block_tables.shape[1], max(1, (max_seqlen_k + bs - 1) // bs))
        table = block_tables[:, :num_blocks].long().clamp(0, nb - 1)  # [B, M]
        length = num_blocks * bs
        positions = torch.arange(length, device=q.device)  # [L]
        limits = (seq_lens.long()[:, None] - query_len + 1
                  + torch.arange(query_len, device=q.device)[None, :])  # [B, Q]
        keep = positions[None, None, :] < limits[:, :, None]  # [B, Q, L]
        inside = (positions[None, :] < seq_lens[:, None].long())[:, :, None, None]  # [B, L, 1, 1]
        k = _to_float(_bytes(k_cache)[table], k_cache.dtype, k_scale).reshape(batch, length, hkv, d)
        v = _to_float(_bytes(v_cache)[table], v_cache.dtype, v_scale).reshape(batch, length, hkv, d)
        k, v = k.masked_fill(~inside, 0.0), v.masked_fill(~inside, 0.0)  # slots past a context may hold NaN
        qg = q.float().view(batch, query_len, hkv, hq // hkv, d)  # [B, Q, Hkv, G, D]
        scores = torch.einsum("bqhgd,blhd->bqhgl", qg, k) * scale  # [B, Q, Hkv, G, L]
        scores = scores.masked_fill(~keep[:, :, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # rows with nothing to attend to -> 0
        out = torch.einsum("bqhgl,blhd->bqhgd", probs, v)  # [B, Q, Hkv, G, D]
        return out.reshape(batch * query_len, hq, d).to(q.dtype)
