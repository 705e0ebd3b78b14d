"""KVScaleSetter: fixes every attention layer's FP8 K/V scales once, before the KV cache is allocated.

In order: the checkpoint's k_scale / v_scale when every layer has them (and calculate_kv_scales is not
True), one number per layer broadcast to every (KV head, channel); else, unless calculate_kv_scales is
False, a calibration run: fixed token ids (the BOS token, then a seeded draw over the vocabulary) go
through the model with attention computed in the model dtype without any cache, each layer records
max |K| and |V| per (KV head, channel) (K after norm and rotary, as stored), reduced to the granularity
below (per tensor), and scale = max(amax, AMAX_FLOOR) * HEADROOM / fp8_max; else 1.0. The scales never change
afterwards: a cached block must read back the same values for every later request (prefix hits,
preemption).
Idea from vLLM's calculate_kv_scales (which calibrates on the first real batch instead).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from nv_engine.config.engine_config import EngineConfig
from nv_kernels.kv_quant import fp8_max
from nv_layers.attention import Attention
from nv_layers.forward_context import ForwardContext, forward_context

logger = logging.getLogger(__name__)

CALIBRATION_SEQ_LEN = 256
CALIBRATION_SEQS = 4
CALIBRATION_SEED = 0
# Unseen inputs may exceed the calibration's max |x|: HEADROOM x amax still fits. FP8 keeps its relative
# precision over ~2**15 (e4m3) below its max, so the headroom costs only the very smallest values.
HEADROOM = 2.0
AMAX_FLOOR = 1e-4
# Calibrated scales per "tensor" (one number per layer), per KV "head", or per (KV head, "channel"); the
# layers and kernels take [Hkv, D] scales either way (per channel costs nothing inside attention). Finer
# scales only where they measurably help: on SmolLM2-135M (tests/test_kv_cache_fp8_accuracy.py) greedy
# chat answers keeping the default's first 16 tokens: 11/20 per tensor, 10/20 per head, 6/20 per channel
# (per-channel max |x| over these random-token batches underestimates real text's, which then clamps;
# 10/20 with headroom 8).
K_GRANULARITY = "tensor"
V_GRANULARITY = "tensor"


class KVScaleSetter:
    """Sets `k_scale` / `v_scale` of `layers` (the model's Attention layers) for the FP8 cache dtype."""

    def __init__(self, config: EngineConfig, device: torch.device, backend: object) -> None:
        self.config, self.device, self.backend = config, device, backend

    def apply(self, layers: Sequence[Attention], run_model: Callable[[torch.Tensor, torch.Tensor], object]) -> str:
        """Set the scales; returns where they came from (for the startup log). run_model(ids, positions)
        runs the model's forward inside the current forward context."""
        config = self.config
        from_checkpoint = all(layer.kv_scales_loaded == {"k", "v"} for layer in layers)
        if from_checkpoint and config.calculate_kv_scales is not True:
            return "from the checkpoint"
        if config.calculate_kv_scales is False:
            for layer in layers:
                for which, scale in (("k", layer.k_scale), ("v", layer.v_scale)):
                    if which not in layer.kv_scales_loaded:
                        scale.fill_(1.0)
            return "1.0 (calibration off" + (", some from the checkpoint)" if any(
                layer.kv_scales_loaded for layer in layers) else ")")
        num_tokens = self._calibrate(layers, run_model)
        return f"calibrated on {num_tokens} tokens"

    @staticmethod
    def _reduce(amax: torch.Tensor, granularity: str) -> torch.Tensor:
        """[Hkv, D] amax -> [Hkv, D] amax shared per tensor, per KV head, or kept per channel."""
        if granularity == "tensor":
            return amax.amax().expand_as(amax)
        if granularity == "head":
            return amax.amax(-1, keepdim=True).expand_as(amax)
        return amax

    @torch.inference_mode()
    def _calibrate(self, layers: Sequence[Attention], run_model: Callable[[torch.Tensor, torch.Tensor], object]) -> int:
        config, dev = self.config, self.device
        # The batch depends on the checkpoint only (not on max_model_len or the step budget): engines with
        # other limits get the same scales, so their outputs stay comparable token for token.
        max_positions = int(getattr(config.hf_config, "max_position_embeddings", 0) or CALIBRATION_SEQ_LEN)
        seq_len, num_seqs = min(CALIBRATION_SEQ_LEN, max_positions), CALIBRATION_SEQS
        vocab = int(config.hf_config.vocab_size)
        gen = torch.Generator().manual_seed(CALIBRATION_SEED)
        ids = torch.randint(0, vocab, (num_seqs, seq_len), generator=gen)             # [S, L]
        bos = getattr(config.hf_config, "bos_token_id", None)
        if isinstance(bos, int) and 0 <= bos < vocab:
            ids[:, 0] = bos
        num_tokens = num_seqs * seq_len
        cu = torch.arange(0, num_tokens + 1, seq_len, dtype=torch.int32)              # [S+1]
        ctx = ForwardContext(
            is_decode=False, slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(num_seqs, 1, dtype=torch.int32, device=dev),
            cu_seqlens_q=cu.to(dev), max_seqlen_q=seq_len, max_seqlen_k=seq_len, logits_indices=None,
            backend=self.backend)
        caches = [(layer.k_cache, layer.v_cache) for layer in layers]
        for layer in layers:        # no cache: attention within the batch, in the model dtype
            layer.k_cache = layer.v_cache = torch.empty(0)
            layer.start_kv_calibration()
        try:
            with forward_context(ctx):
                run_model(ids.reshape(-1).to(dev), torch.arange(seq_len).repeat(num_seqs).to(dev))
            limit = fp8_max(config.kv_dtype)
            for layer in layers:
                if layer.kv_amax is None:
                    raise RuntimeError("an attention layer recorded no K/V during calibration")
                amax = layer.kv_amax                                                    # [2, Hkv, D]
                layer.k_scale.copy_(self._reduce(amax[0], K_GRANULARITY).clamp_min(AMAX_FLOOR) * (HEADROOM / limit))
                layer.v_scale.copy_(self._reduce(amax[1], V_GRANULARITY).clamp_min(AMAX_FLOOR) * (HEADROOM / limit))
        finally:
            for layer, (k_cache, v_cache) in zip(layers, caches, strict=True):
                layer.k_cache, layer.v_cache = k_cache, v_cache
                layer.kv_amax = None
        return num_tokens
