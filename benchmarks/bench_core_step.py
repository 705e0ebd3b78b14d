"""The engine core's host work per step, per phase, without the model's cost.

Drives an EngineCore (async scheduling, as `nv serve` runs it) whose runner does only the host side
of a step (nv_engine.runner.host_only_runner: input staging and sampling tensors, no forward) at a
fixed concurrency of streamed requests shaped like the serving headline: prompts of 100-1,024
random ids, max_tokens 100-1,024, temperature 0.6, ignore_eos, block size 64. A finished request is
replaced at once, so prompt chunks join decode steps every few steps, as in serving.

For each concurrency it prints the CPU milliseconds per step of the whole step (EngineCore.step_outputs
plus encoding the outputs, what the core process does between two polls) measured clean (mean over
all steps, mean and median over pure decode steps), then the exclusive time of each phase measured
with CPU timers wrapped around the methods (a second run; each wrapped call costs about a
microsecond more, charged to its caller's phase):

    add request    EngineCore.add_request of the requests that replace finished ones
    schedule       Scheduler.schedule (without the block manager's calls)
    block manager  BlockManager allocate / match_prefix / cache_full_blocks / free (prefix cache)
    postprocess    Scheduler.postprocess + resolve_placeholders (appending ids, stop checks)
    sampling rows  SamplingBatchBuilder.build (the per-row SamplingBatch)
    step build     StepBuilder.build (ids, positions, slots, block tables)
    runner host    the runner's launch: input staging and sampling tensors (on CUDA with --device cuda)
    collect        the runner's collect (ids back to a list)
    report         the SequenceUpdates of the step (RequestTable.report)
    encode         CoreMessageCodec.encode of the step's EngineCoreOutputs
    core other     everything else inside step_outputs (the core's own glue)

    python benchmarks/bench_core_step.py [--concurrency 64 256] [--steps 1000] [--repeat 3] [--device cpu|cuda]
        [--profile]

--profile also prints cProfile's top functions (by own time) of a third run. The whole step runs on
one thread, so a busy host shows as noise: compare runs made back to back, with --repeat.
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import time
from collections.abc import Callable

import numpy as np

from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core import EngineCore
from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.stage_timer import StageTimer
from nv_engine.executor.uniproc import UniProcExecutor
from nv_engine.model_loader.random_model import qwen3_config
from nv_engine.runner.host_only_runner import HostOnlyRunner
from nv_engine.sampling_params import SamplingParams

PHASES = ("add request", "schedule", "block manager", "postprocess", "sampling rows", "step build", "runner host",
          "collect", "report", "encode", "core other")


class Workload:
    """Keeps `concurrency` streamed requests in flight on an EngineCore; one `step()` is one core step
    plus the encoding of its outputs."""

    def __init__(self, concurrency: int, device: str, seed: int = 0) -> None:
        hf_config = qwen3_config("qwen3-0.6b")
        config = EngineConfig(model="host-only", hf_config=hf_config, device=device, max_model_len=4096,
                              block_size=64, max_num_seqs=max(256, concurrency))
        self.core = EngineCore(config, [0], record_timestamps=True,
                               executor=UniProcExecutor(config, HostOnlyRunner))
        self.codec = CoreMessageCodec()
        self.rng = np.random.default_rng(seed)
        self.num_added = 0
        self.num_tokens = 0
        for _ in range(concurrency):
            self.add()

    def add(self) -> None:
        rng = self.rng
        prompt = rng.integers(1, 10_000, int(rng.integers(100, 1025))).tolist()
        params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=int(rng.integers(100, 1025)),
                                seed=self.num_added)
        params.prepare_for_model(151_936, None)
        self.core.add_request(EngineCoreRequest(f"cmpl-{self.num_added}", prompt, params, True, time.monotonic()))
        self.num_added += 1

    def step(self) -> bool:
        """One step; whether it was a pure decode step (computed no prompt token)."""
        outputs = self.core.step_outputs()
        self.encode(outputs)
        self.num_tokens += outputs.tokens[1]
        for update in outputs.updates:
            if update.finish_reason is not None:
                self.add()
        return outputs.tokens[0] == 0

    def encode(self, outputs: object) -> bytes | bytearray:
        return self.codec.encode(CoreMessage.OUTPUTS, outputs)

    def running(self) -> int:
        return self.core.scheduler.num_running

    def mean_context(self) -> float:
        running = self.core.scheduler.running
        return sum(len(seq.token_ids) for seq in running) / max(1, len(running))


def time_phases(workload: Workload, timer: StageTimer) -> None:
    """Wrap the methods of each phase (instance attributes shadow the class's) with exclusive timers."""
    clock = time.process_time
    children = [0.0]     # per open call: the time of the timed calls inside it

    def wrap(owner: object, name: str, phase: str) -> None:
        method: Callable[..., object] = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            children.append(0.0)
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = clock() - started
                timer.add(phase, elapsed - children.pop())
                children[-1] += elapsed
        setattr(owner, name, timed)

    core = workload.core
    scheduler = core.scheduler
    for name in ("allocate", "match_prefix", "cache_full_blocks", "free"):
        wrap(scheduler.block_manager, name, "block manager")
    wrap(scheduler, "schedule", "schedule")
    wrap(scheduler, "postprocess", "postprocess")
    wrap(scheduler, "resolve_placeholders", "postprocess")
    wrap(core.sampling_builder, "build", "sampling rows")
    wrap(core.step_builder, "build", "step build")
    executor = core.live_executor()
    wrap(executor, "launch", "runner host")
    wrap(executor, "collect", "collect")
    wrap(core.requests, "report", "report")
    wrap(core, "step_outputs", "core other")
    wrap(workload, "encode", "encode")
    wrap(core, "add_request", "add request")


def clean_run(concurrency: int, steps: int, warmup: int, device: str) -> dict[bool, list[float]]:
    """CPU seconds of each measured step, by whether it was a pure decode step."""
    clean = Workload(concurrency, device)
    for _ in range(warmup):
        clean.step()
    clock = time.process_time
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps):
        started = clock()
        is_decode = clean.step()
        times[is_decode].append(clock() - started)
    print(f"\n{concurrency} streams: {clean.running()} running, mean context {clean.mean_context():.0f} tokens, "
          f"{clean.num_tokens / (warmup + steps):.1f} sampled per step")
    clean.core.shutdown()
    return times


def run(concurrency: int, steps: int, warmup: int, device: str, repeat: int, profile: bool) -> None:
    for _ in range(repeat):
        times = clean_run(concurrency, steps, warmup, device)
        total_ms = sum(map(sum, times.values())) * 1e3 / steps
        decode_ms = np.mean(times[True]) * 1e3 if times[True] else 0.0
        decode_median_ms = np.median(times[True]) * 1e3 if times[True] else 0.0
        chunk_ms = np.mean(times[False]) * 1e3 if times[False] else 0.0
        print(f"  host work per step (clean run): {total_ms:.3f} ms; decode steps {decode_ms:.3f} ms "
              f"(median {decode_median_ms:.3f}, {len(times[True])} steps), steps with a prompt chunk "
              f"{chunk_ms:.3f} ms ({len(times[False])})")

    timed = Workload(concurrency, device)
    timer = StageTimer("core step", "step", PHASES, logging.getLogger(__name__), interval_s=float("inf"))
    for _ in range(warmup):
        timed.step()
    time_phases(timed, timer)
    for _ in range(steps):
        timed.step()
        timer.end_round()
    per_step = timer.per_round_ms()
    print(f"  {'phase':<14} {'ms/step':>8}")
    for phase in PHASES:
        print(f"  {phase:<14} {per_step[phase]:8.3f}")
    print(f"  {'sum':<14} {sum(per_step.values()):8.3f}")
    timed.core.shutdown()

    if profile:
        profiled = Workload(concurrency, device)
        for _ in range(warmup):
            profiled.step()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            profiled.step()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        profiled.core.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=600, help="steps before measuring (requests turn over)")
    parser.add_argument("--repeat", type=int, default=1, help="clean runs per concurrency (a busy host varies)")
    parser.add_argument("--device", default="cpu", help="where the runner stages its inputs (cpu or cuda)")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    args = parser.parse_args()
    for concurrency in args.concurrency:
        run(concurrency, args.steps, args.warmup, args.device, args.repeat, args.profile)


if __name__ == "__main__":
    main()
