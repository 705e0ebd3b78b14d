"""ModelRunner: one per tensor-parallel rank. Owns the model, the KV cache, the CUDA graphs and the
device side of a step (inputs -> forward -> logits -> sampled ids).

A step is `launch(step)` (stage inputs with numpy into pinned memory, one copy per dtype, run the model: a CUDA
graph for pure decode or for a verify step of speculative decoding (runner.verify_graphs), piecewise graphs around
an eager attention for other steps of up to 2,048 tokens (runner.mixed_graphs), eager beyond; sample on the device
(a pure-decode step that needs only temperatures: LM head and draw in a second graph, runner.head_graphs), start
the copy of the sampled ids to pinned host memory) then `collect()` (wait on an event, return the ids). `execute`
does both; an engine that overlaps steps can call launch for step N+1 before collect of step N.

A step launched with `StepInput.defer_sampling` stops at the logits; `sample(token_bitmask)` then samples it with
a structured-output bitmask the host filled while the forward ran (the mask of step N+1 needs step N's ids on the
host; the forward of N+1 does not). Nothing is launched in between: the next `launch` takes this step's ids.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import cast

import numpy as np
import torch
import torch.distributed as dist

from nv_engine import envs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.step import PromptLogprobsResult, StepInput, StepResult
from nv_engine.model_loader.registry import get_model_class
from nv_engine.runner.cuda_graphs import DecodeGraphs
from nv_engine.runner.draft_model_runner import DraftModelRunner
from nv_engine.runner.draft_verifier import DraftVerifier
from nv_engine.runner.dummy_step_profiler import CausalLM, DummyStepProfiler, KVCacheLayer
from nv_engine.runner.head_graphs import HeadRun, SampledHeadGraphs
from nv_engine.runner.input_stager import InputStager, StagedStep
from nv_engine.runner.kv_scales import KVScaleSetter
from nv_engine.runner.memory import cpu_num_blocks
from nv_engine.runner.mixed_graphs import MixedStepGraphs, mixed_graph_sizes
from nv_engine.runner.prompt_logprobs_head import PromptLogprobsHead
from nv_engine.runner.result_copier import ResultCopier
from nv_engine.runner.sampling_tensors import SamplingTensorsSource
from nv_engine.runner.staged_forward import StagedForward
from nv_engine.runner.unsampled_step import UnsampledStep
from nv_engine.runner.verify_graphs import VerifyGraphs
from nv_kernels import get_backend
from nv_kernels.fused_dispatch import set_fused_ops
from nv_kernels.kv_layout import allocate_kv_cache
from nv_kernels.kv_quant import is_fp8
from nv_layers.attention import Attention
from nv_layers.forward_context import forward_context
from nv_layers.loader import build_model
from nv_layers.parallel_state import (
    get_tp_group,
    get_tp_rank,
    get_tp_size,
    init_custom_all_reduce,
    release_custom_all_reduce,
    tp_group_aborted,
)
from nv_layers.sampler import Sampler, SamplerOutput, SamplingTensors

logger = logging.getLogger(__name__)

FP8_KV_BACKENDS = ("triton", "torch")   # the backends that read an FP8 KV cache (nv_kernels.kv_quant)


def runner_device(config: EngineConfig, rank: int) -> torch.device:
    if not config.is_cuda:
        return torch.device("cpu")
    if config.tensor_parallel_size == 1 and ":" in config.device:
        return torch.device(config.device)
    local_rank = envs.local_rank(rank)
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


class ModelRunner:
    # ---- construction ------------------------------------------------------------------------
    def __init__(self, config: EngineConfig, rank: int = 0) -> None:
        self.config, self.rank = config, rank
        set_fused_ops(config.fused_ops)   # process-wide: every model this process builds after this
        self.device = runner_device(config, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.is_driver = get_tp_rank() == 0
        torch.manual_seed(config.seed)
        self.model = cast(CausalLM, build_model(get_model_class(config.hf_config), config.hf_config, config.model,
                                                dtype=config.dtype, device=self.device,
                                                quantization=config.quantization))
        # the symmetric-memory all-reduce: collective over the TP group, before any graph capture
        self.owns_custom_all_reduce = (not config.disable_custom_all_reduce
                                       and init_custom_all_reduce(self.device, config.dtype))
        self.backend = get_backend(config.attention_backend, self.device)
        if is_fp8(config.kv_dtype) and self.backend.name not in FP8_KV_BACKENDS:
            if config.attention_backend is not None:
                raise ValueError(f"attention_backend={config.attention_backend!r} cannot read nv's FP8 KV cache "
                                 f"(kv_cache_dtype={config.kv_cache_dtype!r}); use one of {FP8_KV_BACKENDS}")
            logger.info("attention backend %s cannot read an FP8 KV cache: using triton", self.backend.name)
            self.backend = get_backend("triton", self.device)
        spec = config.speculative_config      # draft_model: the draft model, its KV cache and staging (eager)
        self.draft_runner = DraftModelRunner(config, self.device, self.backend) if spec and spec.model else None
        self.sampler = Sampler()
        self.draft_verifier = DraftVerifier()
        self.sampling_tensors = SamplingTensorsSource(self.device)
        self.attention_layers = cast(list[KVCacheLayer], [m for m in self.model.modules()
                                                          if hasattr(m, "k_cache") and hasattr(m, "v_cache")])
        if not self.attention_layers:
            raise ValueError(f"{type(self.model).__name__} has no attention layers with a KV cache")
        self.memory_profiler = DummyStepProfiler(self.model, self.attention_layers, self.backend, self.sampler,
                                                  self.sampling_tensors, config, self.device)
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.graphs: DecodeGraphs | None = None
        self.head_graphs: SampledHeadGraphs | None = None   # LM head + temperature-only draw (TP 1)
        self.mixed_graphs: MixedStepGraphs | None = None   # steps that are not pure decode (TP 1)
        self.verify_graphs: VerifyGraphs | None = None     # speculative decoding's verify steps
        self.staged_forward = StagedForward(self.model, self.device)   # graph captures' forwards
        self.max_batch = config.max_num_seqs
        self.stager = InputStager(self.backend, max_model_len=config.max_model_len,
                                  max_blocks_per_seq=config.max_blocks_per_seq,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  max_num_seqs=self.max_batch, device=self.device,
                                  num_speculative_tokens=spec.num_speculative_tokens if spec else 0)
        self.results = ResultCopier(self.max_batch, self.device)
        self.prompt_logprobs = PromptLogprobsHead(self.model, self.device, self.is_driver)
        self.last_sampled: torch.Tensor | None = None   # [S] sampled ids of the last launched step
        self.unsampled: UnsampledStep | None = None     # a defer_sampling step waiting for sample()
        # With the symmetric-memory all-reduce, rank 0 polls an event per launched step instead of
        # blocking on it: a dead peer's barrier never returns (see parallel_state.mark_tp_group_aborted).
        self.launched_events: deque[torch.cuda.Event] = deque()

    def uses_custom_all_reduce(self) -> bool:
        """Whether this rank's all-reduces of small tensors go through symmetric memory."""
        return self.owns_custom_all_reduce

    def kv_block_bytes(self) -> int:
        itemsize = torch.empty(0, dtype=self.config.kv_dtype).element_size()   # 1 for FP8
        draft = self.draft_runner.kv_block_bytes() if self.draft_runner is not None else 0   # draft_model's
        return draft + sum(2 * self.config.block_size * layer.num_kv_heads * layer.head_dim * itemsize
                           for layer in self.attention_layers)

    # ---- KV cache sizing ---------------------------------------------------------------------
    @torch.inference_mode()
    def determine_num_blocks(self) -> int:
        config = self.config
        if config.num_gpu_blocks_override is not None:
            num_blocks = config.num_gpu_blocks_override
        elif self.device.type == "cuda":
            profile = self.memory_profiler.profile()
            budget = profile.kv_budget(config.gpu_memory_utilization)
            logger.info("KV-cache budget: %s", profile.describe(config.gpu_memory_utilization))
            num_blocks = max(0, budget // self.kv_block_bytes())
        else:
            num_blocks = cpu_num_blocks(self.kv_block_bytes(), config.max_num_seqs,
                                        config.max_blocks_per_seq, config.cpu_kv_cache_space_gib)
        num_blocks = self._agree_min(num_blocks)
        if num_blocks < 1:
            raise ValueError("no memory is left for the KV cache: raise gpu_memory_utilization "
                             f"({config.gpu_memory_utilization}) or lower max_num_batched_tokens "
                             f"({config.max_num_batched_tokens}) / max_num_seqs ({config.max_num_seqs})")
        return num_blocks

    def _agree_min(self, value: int) -> int:
        """All ranks take the smallest value (all_reduce MIN over the TP group)."""
        if get_tp_size() == 1:
            return value
        device = self.device if dist.get_backend(get_tp_group()) == "nccl" else torch.device("cpu")
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=get_tp_group())
        return int(tensor.item())

    # ---- KV cache and graphs -----------------------------------------------------------------
    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Per layer one storage tensor; its [NB, BS, Hkv, D] views go to the layer's k_cache / v_cache
        (nv_kernels.kv_layout: V token-major in an FP8 cache).
        An FP8 cache gets its per-layer scales first (KVScaleSetter), fixed from then on."""
        config = self.config
        scales = ""
        if is_fp8(config.kv_dtype):
            layers = cast(list[Attention], self.attention_layers)
            origin = KVScaleSetter(config, self.device, self.backend).apply(layers, self.model)
            k = torch.cat([layer.k_scale.flatten() for layer in layers]).tolist()
            v = torch.cat([layer.v_scale.flatten() for layer in layers]).tolist()
            scales = (f", K/V scales {origin} (k {min(k):.3g}..{max(k):.3g}, "
                      f"v {min(v):.3g}..{max(v):.3g})")
        self.num_blocks = num_blocks
        self.kv_caches = []
        for layer in self.attention_layers:
            kv, layer.k_cache, layer.v_cache = allocate_kv_cache(
                num_blocks, config.block_size, layer.num_kv_heads, layer.head_dim, config.kv_dtype, self.device)
            self.kv_caches.append(kv)
        if self.draft_runner is not None:           # the same blocks in the draft model's own KV tensors
            self.draft_runner.allocate_kv_cache(num_blocks)
        logger.info("KV cache: %d blocks x %d tokens = %d tokens, %.2f GiB, dtype %s (kv_cache_dtype=%s)%s",
                    num_blocks, config.block_size, num_blocks * config.block_size,
                    num_blocks * self.kv_block_bytes() / (1 << 30), str(config.kv_dtype).removeprefix("torch."),
                    config.kv_cache_dtype, scales)

    @torch.inference_mode()
    def capture_cudagraphs(self, emulate: bool = False) -> None:
        """Capture the decode graphs on CUDA. emulate=True records them as eager replays instead
        (tests of the graph input layout on CPU). With enforce_eager on CUDA, decode batches are
        still padded to the graph sizes but run eagerly: the same kernels on the same shapes, so
        eager and graph runs give the same numbers."""
        if self.device.type != "cuda" and not emulate:
            return
        if self.draft_runner is not None:                # draft_model: the proposal forwards' decode graphs
            self.draft_runner.capture_cudagraphs(emulate)
        emulate_mixed = emulate                          # enforce_eager: mixed steps stay plain eager
        emulate = emulate or self.config.enforce_eager
        if not self.kv_caches:
            raise RuntimeError("allocate_kv_cache must run before capture_cudagraphs")
        max_bs = min(self.max_batch, self.config.max_num_batched_tokens)
        hidden_size = self.config.hf_config.hidden_size
        self.graphs = DecodeGraphs(max_bs, hidden_size, self.config.dtype, self.device, emulate=emulate)
        stage_decode: Callable[[int], StagedStep] = lambda bs: self.stager.stage_decode(bs, None, dummy=True)  # noqa: E731
        # piecewise graphs of the steps that are not pure decode: one rank alone (cuda_graph_mode decides)
        piecewise = get_tp_size() == 1 and self.config.piecewise_graphs
        sizes = mixed_graph_sizes(self.config.max_num_batched_tokens) if piecewise else []
        if self.config.enforce_eager and not emulate_mixed:
            sizes = []
        verify = self.verify_graphs = VerifyGraphs.build(self.config, self.backend, self.stager, self.device, emulate)
        passes = [(stage_decode, self.graphs.sizes), (self.stager.stage_dummy_mixed, sizes)]
        if verify is not None:
            passes.append((verify.stage_dummy, verify.sizes))
        if not emulate and get_tp_size() == 1:     # a rank alone decides what to compile ahead (no collectives)
            self.staged_forward.compile_ahead(passes)
        self.graphs.capture(*self.staged_forward.pair(stage_decode))
        if verify is not None:
            verify.capture(*self.staged_forward.pair(verify.stage_dummy), pool=self.graphs.pool)
        if get_tp_size() == 1:
            self.head_graphs = SampledHeadGraphs(self.graphs.sizes, self.device, emulate=emulate)
            self.head_graphs.capture(self._head_for_size, self.graphs.pool)
        if not sizes:
            return
        layer = cast(Attention, self.attention_layers[0])
        self.mixed_graphs = MixedStepGraphs(sizes, layer.num_heads * layer.head_dim, hidden_size, self.config.dtype,
                                            self.device, pool=self.graphs.pool, emulate=emulate_mixed)
        self.mixed_graphs.capture(*self.staged_forward.pair(self.stager.stage_dummy_mixed))

    def _head_for_size(self, size: int) -> HeadRun:
        """The LM head and temperature-only draw over the decode graphs' hidden [size, H] and the draw inputs
        of a dummy decode batch of `size` rows staged now (the addresses every later step of that size uses)."""
        if self.graphs is None:
            raise RuntimeError("the decode graphs are captured before the LM head's")
        draw = self.stager.stage_decode(size, None, dummy=True).draw
        if draw is None:
            raise RuntimeError("the decode layout stages the draw inputs")
        tensors = self.sampling_tensors.temperature_only(draw)
        hidden = self.graphs.hidden[:size]
        return lambda: self.sampler(self.model.compute_logits(hidden), tensors).token_ids

    # ---- steps -------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepResult | None:
        self.launch(step)
        return self.collect()

    @torch.inference_mode()
    def launch(self, step: StepInput) -> None:
        """Queue one step on the device; sampled ids are copied back asynchronously (collect()).
        Input ids at step.prev_rows are taken on the device from the previous launched step's
        sampled ids (an engine that schedules step N+1 before it has step N's tokens).
        step.defer_sampling: stop at the logits; `sample()` samples them."""
        if self.unsampled is not None:
            self.unsampled = None
            raise RuntimeError("launch() after a defer_sampling step that was never sampled")
        batch = step.num_seqs
        graphs = self.graphs if step.is_decode else None
        padded = graphs.padded_size(batch) if graphs is not None else None
        verify_graphs = self.verify_graphs                                # speculative decoding's verify steps
        verify = verify_graphs.padded_size(step) if verify_graphs is not None else None
        mixed = (self.mixed_graphs.padded_size(step.num_tokens) if padded is None and verify is None
                 and self.mixed_graphs else None)
        drafts = self.draft_runner.propose(step) if self.draft_runner is not None else None   # draft_model
        if verify_graphs is not None and verify is not None:
            staged = verify_graphs.stage(verify, step)
        else:
            staged = self.stager.stage_decode(padded, step) if padded is not None else self.stager.stage_eager(
                step, mixed)
        if staged.prev_rows is not None:
            if self.last_sampled is None:
                raise RuntimeError("step.prev_rows refers to a previous step that sampled nothing")
            staged.ids[staged.prev_rows] = self.last_sampled[staged.prev_src]
        if drafts is not None and self.draft_runner is not None:
            self.draft_runner.fill_target_ids(staged.ids, drafts, step, staged.row_of_token)
        prompt_logprobs = None                 # PromptLogprobsResult: only eager steps carry prompt rows
        if graphs is not None and padded is not None:
            hidden = graphs.replay(padded, batch)                         # [B, H]
            heads = self.head_graphs
            if heads is not None and not step.defer_sampling and (
                    step.sampling is None or step.sampling.temperature_only):
                self._sampled(SamplerOutput(heads.replay(padded, batch), None, None, None, None), None)
                return
            logits = self.model.compute_logits(hidden)                    # [B, V]
        elif verify_graphs is not None and verify is not None:
            hidden = verify_graphs.replay(verify, batch)                  # [B * Q, H]
            logits = self.model.compute_logits(hidden[staged.logits_rows])   # [S * (K+1), V]
        else:
            with forward_context(staged.ctx):
                if mixed is not None and self.mixed_graphs is not None:
                    hidden = self.mixed_graphs.replay(mixed, step.num_tokens)   # [T, H]
                else:
                    hidden = self.model(staged.ids, staged.positions)         # [T, H]
                logits = None if len(step.logits_indices) == 0 else self.model.compute_logits(hidden)  # [S, V]
            if step.prompt_logprobs is not None:
                prompt_logprobs = self.prompt_logprobs(hidden, staged.ctx, step.prompt_logprobs)
        if logits is None:                                                # only partial prefill chunks
            self.last_sampled = None
            if self.is_driver:
                self.results.start(None, prompt_logprobs)
                self._record_launched()
            return
        if step.defer_sampling:
            self.unsampled = UnsampledStep(logits, step.sampling, prompt_logprobs)
            return
        if step.num_drafts is not None:        # speculative decoding: K+1 rows per sequence
            tensors = self.sampling_tensors.for_step(step.sampling, len(step.num_drafts))
            self._sampled(self.draft_verifier(logits, step, tensors, drafts, staged.drafts), prompt_logprobs)
            return
        self._sample(logits, self.sampling_tensors.for_step(step.sampling, logits.shape[0]), prompt_logprobs)

    @torch.inference_mode()
    def sample(self, token_bitmask: np.ndarray | None) -> None:
        """Sample the step launched with defer_sampling, with this [S, ceil(V/32)] int32 bitmask
        (None: no row has a grammar); its ids come from the matching `collect()`."""
        step, self.unsampled = self.unsampled, None
        if step is None:
            raise RuntimeError("sample() without a step launched with defer_sampling")
        tensors = self.sampling_tensors.for_step(step.sampling, step.logits.shape[0], token_bitmask)
        self._sample(step.logits, tensors, step.prompt_logprobs)

    def _sample(self, logits: torch.Tensor, tensors: SamplingTensors,
                prompt_logprobs: PromptLogprobsResult | None) -> None:
        # Every rank samples: the logits are bitwise identical on all ranks (the LM head's all-gather
        # and the all-reduces sum in the same order everywhere) and the draw is a hash of (seed,
        # position), so every rank holds the same ids and takes the next step's input ids from its
        # own copy without a host round trip. Only rank 0 copies them back to the host.
        self._sampled(self.sampler(logits, tensors), prompt_logprobs)

    def _sampled(self, out: SamplerOutput, prompt_logprobs: PromptLogprobsResult | None) -> None:
        self.last_sampled = out.token_ids                                 # [S] on the device
        if self.is_driver:
            self.results.start(out, prompt_logprobs)
            self._record_launched()

    def _record_launched(self) -> None:
        """One event per launched step (rank 0, symmetric-memory all-reduce on), polled by collect()."""
        if self.owns_custom_all_reduce:
            event = torch.cuda.Event()
            event.record()
            self.launched_events.append(event)

    def collect(self) -> StepResult | None:
        """Wait for the oldest uncollected step's sampled ids (rank 0); None on other ranks."""
        if not self.is_driver:
            return None
        if self.launched_events:
            event = self.launched_events.popleft()
            while not event.query():
                if tp_group_aborted():
                    raise RuntimeError("a tensor-parallel peer died: the step cannot finish")
                time.sleep(0)                      # lets the executor's watcher thread run
        return self.results.finish()

    # ---- shutdown ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        for graphs in (self.head_graphs, self.graphs, self.mixed_graphs, self.verify_graphs):
            if graphs is not None:
                graphs.release()
        self.head_graphs = self.graphs = self.mixed_graphs = self.verify_graphs = None
        if self.owns_custom_all_reduce:
            release_custom_all_reduce()
            self.owns_custom_all_reduce = False
        for layer in self.attention_layers:
            layer.k_cache = torch.empty(0)
            layer.v_cache = torch.empty(0)
        if self.draft_runner is not None:
            self.draft_runner.release()
        self.kv_caches = []
        self.unsampled = None
        self.launched_events.clear()
        if self.device.type == "cuda" and not tp_group_aborted():   # aborted: the device may never finish
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
