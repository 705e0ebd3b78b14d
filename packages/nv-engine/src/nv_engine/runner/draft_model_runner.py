"""DraftModelRunner: the draft model of draft_model speculative decoding, inside the target's ModelRunner.

The draft model lives on the target's device and process (tensor_parallel_size 1), with a paged KV cache of its own
per layer: [num_blocks, block_size, Hkv_draft, D_draft] for K and V, with the target's number of blocks and block
size, addressed through the target's block tables and slot mapping. So one BlockManager owns both caches' blocks
(prefix caching, preemption by recompute, freeing), and the KV-cache sizing counts both models' bytes per block.
Its KV is kept in the model dtype (an FP8 target cache does not make the draft's FP8).

Per step with StepInput.draft (built by spec_decode.draft_model_planner), before the target's forward: the
catch-up forwards (prefill layout) over the tokens the draft has not computed, whose logits give each drafting
sequence's draft 1, then K-1 decode-layout forwards, each feeding the previous drafts. Drafts are the argmax
(draft_sampling "greedy", vLLM's way: point masses, which the RejectionSampler verifies exactly at any target
temperature), or with "sampled" drawn like the target's own tokens from the draft's processed distribution q
(the request's temperature, top-k, top-p, min-p; Gumbel noise keyed by (seed, position), salted apart from the
target's draws; greedy rows keep the argmax), q going to the RejectionSampler (accept min(1, p/q)). The forwards
stage their inputs with an InputStager of their own, so the target's staged inputs are untouched; the row indices
that pick each forward's sequences, and the target's rows the drafts go to, take one pinned non-blocking copy each
per step (a PinnedStage). The drafts stay on the device, go into the target's input ids and to the DraftVerifier.
On CUDA a drafting step of up to speculative_config.max_batch_size sequences (the most a drafting step has)
replays graphs only, captured with the target's: the catch-up in the verify graphs' fixed layout of 1 + k rows
per sequence (runner.catchup_graphs), when each sequence has at most 1 + k tokens to catch up (every decode-only
step in steady decoding), and the decode-layout forwards in decode graphs of their own (runner.cuda_graphs'
DecodeGraphs). A catch-up that does not fit (prompt chunks, a draft lagging after steps without drafts) runs
eagerly.
"""
from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import torch

from nv_engine.config.engine_config import EngineConfig
from nv_engine.config.quantization import resolve_quantization
from nv_engine.core.step import StepInput
from nv_engine.model_loader.model_path import load_hf_config
from nv_engine.model_loader.registry import get_model_class
from nv_engine.runner.catchup_graphs import CatchupGraphs
from nv_engine.runner.cuda_graphs import DecodeGraphs
from nv_engine.runner.draft_proposal import DraftProposal
from nv_engine.runner.dummy_step_profiler import CausalLM, KVCacheLayer
from nv_engine.runner.input_stager import InputStager
from nv_engine.runner.pinned_stage import PinnedStage
from nv_engine.runner.sampling_tensors import SamplingTensorsSource
from nv_engine.runner.staged_forward import StagedForward
from nv_kernels import AttentionBackend
from nv_kernels.kv_layout import allocate_kv_cache
from nv_kernels.sampler_hash import gumbel_noise, mix32, row_keys, token_keys
from nv_layers.forward_context import forward_context
from nv_layers.loader import build_model
from nv_layers.rejection_sampler import RejectionSampler
from nv_layers.sampler import SamplingTensors

# Salts a draft draw's key so its noise is independent of the target's draws (Gumbel noise and acceptance
# uniforms) at the same (seed, position).
_DRAFT_SALT = 0x27D4EB2F


class DraftModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device, backend: AttentionBackend) -> None:
        spec = config.speculative_config
        if spec is None or spec.model is None:
            raise ValueError("DraftModelRunner needs speculative_config with a draft model")
        if config.tensor_parallel_size != 1:
            raise ValueError(f"draft_model needs tensor_parallel_size 1 for now, got {config.tensor_parallel_size}")
        hf_config = load_hf_config(spec.model)
        self.model = cast(CausalLM, build_model(get_model_class(hf_config), hf_config, spec.model,
                                                dtype=config.dtype, device=device,
                                                quantization=resolve_quantization(None, hf_config)))
        self.attention_layers = cast(list[KVCacheLayer], [m for m in self.model.modules()
                                                          if hasattr(m, "k_cache") and hasattr(m, "v_cache")])
        if not self.attention_layers:
            raise ValueError(f"the draft model {type(self.model).__name__} has no attention layers with a KV cache")
        self.config, self.device = config, device
        self.hidden_size = int(hf_config.hidden_size)
        self.max_drafting_seqs = min(config.max_num_seqs, spec.max_batch_size)   # rows of a proposal forward
        self.graphs: DecodeGraphs | None = None                                  # the proposal forwards' (CUDA)
        # the catch-up forwards' (CUDA): Q = 1 + k rows per sequence, as many sequences as a proposal forward
        self.catchup_query_len = 1 + spec.num_speculative_tokens
        self.max_catchup_seqs = min(self.max_drafting_seqs, config.max_num_batched_tokens // self.catchup_query_len)
        self.catchup_graphs: CatchupGraphs | None = None
        self.kv_dtype = config.dtype
        self.stager = InputStager(backend, max_model_len=config.max_model_len,
                                  max_blocks_per_seq=config.max_blocks_per_seq,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  max_num_seqs=config.max_num_seqs, device=device,
                                  num_speculative_tokens=spec.num_speculative_tokens)
        self.kv_caches: list[torch.Tensor] = []
        self.sampled = spec.draft_sampling == "sampled"
        self.sampling_tensors = SamplingTensorsSource(device)
        self.token_keys: torch.Tensor | None = None            # [V] the draws' per-token keys, made at first use
        # a drafting step's row indices (the sequences of each forward; where the drafts go in the target's ids):
        # one pinned, non-blocking copy for the draft's forwards and one for the target's ids
        self.row_stage = PinnedStage(device)

    def kv_block_bytes(self) -> int:
        """The draft's KV bytes per block (all its layers, K and V)."""
        itemsize = torch.empty(0, dtype=self.kv_dtype).element_size()
        return sum(2 * self.config.block_size * layer.num_kv_heads * layer.head_dim * itemsize
                   for layer in self.attention_layers)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """The draft's caches with the target's num_blocks (zeroed: a position never written reads as zeros)."""
        self.kv_caches = []
        for layer in self.attention_layers:
            kv, layer.k_cache, layer.v_cache = allocate_kv_cache(
                num_blocks, self.config.block_size, layer.num_kv_heads, layer.head_dim, self.kv_dtype, self.device)
            self.kv_caches.append(kv)

    @torch.inference_mode()
    def capture_cudagraphs(self, emulate: bool = False) -> None:
        """Decode graphs for the proposal forwards, as ModelRunner.capture_cudagraphs does for the target's decode
        steps, and catch-up graphs in the verify layout (in the same pool) where the backend decodes several
        query tokens per sequence (emulate=True: eager replays on the static staging addresses; enforce_eager: the
        same on CUDA)."""
        if self.device.type != "cuda" and not emulate:
            return
        if not self.kv_caches:
            raise RuntimeError("allocate_kv_cache must run before capture_cudagraphs")
        emulate = emulate or self.config.enforce_eager
        forward = StagedForward(self.model, self.device)
        self.graphs = DecodeGraphs(self.max_drafting_seqs, self.hidden_size, self.config.dtype, self.device,
                                   emulate=emulate)
        self.graphs.capture(*forward.pair(lambda size: self.stager.stage_decode(size, None, dummy=True)))
        if self.max_catchup_seqs < 1 or not hasattr(self.stager.backend, "decode_queries"):
            return
        self.catchup_graphs = CatchupGraphs(self.max_catchup_seqs, self.catchup_query_len, self.hidden_size,
                                            self.config.dtype, self.device, self.stager, emulate)
        self.catchup_graphs.capture(*forward.pair(self.catchup_graphs.stage_dummy), pool=self.graphs.pool)

    @torch.inference_mode()
    def propose(self, step: StepInput) -> DraftProposal | None:
        """Run the step's draft forwards; the drafts on the device, or None when the step verifies no drafts (the
        draft only caught up, or has nothing to do: step.draft None)."""
        draft = step.draft
        if draft is None:
            return None
        width = 0 if step.draft_ids is None else int(step.draft_ids.shape[1])
        num_seqs = len(step.logits_indices) // (width + 1) if width else 0
        tensors = None            # sampled drafting: the sampling rows' parameters, [S] each
        if self.sampled and width and step.sampling is not None and not step.sampling.flags["all_greedy"]:
            tensors = self.sampling_tensors.for_step(step.sampling, num_seqs)
        proposal = DraftProposal(torch.zeros(num_seqs, max(width, 1), dtype=torch.int64, device=self.device), None)
        seqs_of = [*draft.catchup_seqs, *draft.proposal_seqs]    # each forward's sampling sequences, [D_n] each
        rows_of = self._upload_split(seqs_of)
        catchup_rows = rows_of[:len(draft.catchup)]
        for inputs, seqs, rows in zip(draft.catchup, draft.catchup_seqs, catchup_rows, strict=True):
            logits = self._forward(inputs, None, need_logits=len(seqs) > 0)                    # [D, V]
            if logits is not None:
                proposal = self._choose(proposal, logits, rows, 0, tensors)
        for j, (inputs, rows) in enumerate(zip(draft.proposals, rows_of[len(draft.catchup):], strict=True), start=1):
            logits = self._forward(inputs, proposal.ids[rows, j - 1], need_logits=True)        # [D_j, V]
            if logits is not None:
                proposal = self._choose(proposal, logits, rows, j, tensors)
        return proposal if width else None

    def _upload_split(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """int64 arrays to the device in one pinned copy (no wait on the device's queue): a view of each."""
        if not arrays:
            return []
        joined = self.row_stage.upload(np.concatenate(arrays).astype(np.int64, copy=False))
        return list(torch.split(joined, [len(a) for a in arrays]))

    def _choose(self, proposal: DraftProposal, logits: torch.Tensor, rows: torch.Tensor, slot: int,
                tensors: SamplingTensors | None) -> DraftProposal:
        """Draft `slot` of the sampling sequences `rows` from their logits [D, V]: the argmax, or (tensors given)
        drawn from q, recorded in the proposal's probs."""
        if tensors is None:
            proposal.ids[rows, slot] = logits.argmax(dim=-1)
            return proposal
        t = dataclasses.replace(tensors, temperatures=tensors.temperatures[rows], top_k=tensors.top_k[rows],
                                top_p=tensors.top_p[rows], min_p=tensors.min_p[rows], seeds=tensors.seeds[rows],
                                positions=tensors.positions[rows] + slot)   # the output index this draft proposes
        q = RejectionSampler.processed_probs(logits.float(), t)                                # [D, V]
        if self.token_keys is None:
            self.token_keys = token_keys(q.shape[1], q.device)
        noise = gumbel_noise(mix32(row_keys(t.seeds, t.positions) ^ _DRAFT_SALT), self.token_keys)
        drawn = (q.log() + noise).argmax(dim=-1)                                               # [D]
        proposal.ids[rows, slot] = torch.where(t.temperatures <= 0, logits.argmax(dim=-1), drawn)
        probs = proposal.probs
        if probs is None:
            probs = torch.zeros(*proposal.ids.shape, q.shape[1], device=q.device)              # [S, K, V]
        probs[rows, slot] = q
        return DraftProposal(proposal.ids, probs)

    def _forward(self, inputs: StepInput, ids: torch.Tensor | None, need_logits: bool) -> torch.Tensor | None:
        """One forward of the draft model on `inputs` (ids: its input ids on the device instead of
        inputs.input_ids); the logits of inputs.logits_indices (decode layout: every row) when need_logits. A
        decode-layout forward replays a decode graph when one of its size was captured, a catch-up forward a
        catch-up graph when it fits one; others run eagerly."""
        catchup = self.catchup_graphs if not inputs.is_decode and ids is None else None
        catchup_padded = catchup.padded_size(inputs) if catchup is not None else None
        if catchup is not None and catchup_padded is not None:
            rows = catchup.stage(catchup_padded, inputs).logits_rows                          # [D] of [B * Q]
            hidden = catchup.replay(catchup_padded, inputs.num_seqs)                          # [B * Q, H]
            return self.model.compute_logits(hidden[rows]) if need_logits and rows is not None else None
        graphs = self.graphs if inputs.is_decode else None
        padded = graphs.padded_size(inputs.num_seqs) if graphs is not None else None
        if graphs is not None and padded is not None:
            staged = self.stager.stage_decode(padded, inputs)                                  # padding: slot -1
            if ids is not None:
                staged.ids[:inputs.num_seqs].copy_(ids)
            hidden = graphs.replay(padded, inputs.num_seqs)                                    # [D, H]
            return self.model.compute_logits(hidden) if need_logits else None
        staged = self.stager.stage_eager(inputs)
        if ids is not None:
            staged.ids.copy_(ids)
        with forward_context(staged.ctx):
            hidden = self.model(staged.ids, staged.positions)                                  # [T, H]
            return self.model.compute_logits(hidden) if need_logits else None

    def fill_target_ids(self, ids: torch.Tensor, proposal: DraftProposal, step: StepInput,
                        row_of_token: np.ndarray | None = None) -> None:
        """Write the [S, K] drafts into the step's staged target input ids ([T] or padded) at their rows;
        row_of_token [T]: the staged row of each compact row (a verify graph's layout, runner.verify_layout)."""
        if step.draft is None:
            raise RuntimeError("fill_target_ids needs a step with draft inputs")
        target_rows = step.draft.target_rows if row_of_token is None else row_of_token[step.draft.target_rows]
        rows, index = self._upload_split([target_rows, step.draft.draft_index])               # [N] each
        ids[rows] = proposal.ids.reshape(-1)[index]

    def release(self) -> None:
        for graphs in (self.graphs, self.catchup_graphs):
            if graphs is not None:
                graphs.release()
        self.graphs = self.catchup_graphs = None
        for layer in self.attention_layers:
            layer.k_cache = torch.empty(0)
            layer.v_cache = torch.empty(0)
        self.kv_caches = []
