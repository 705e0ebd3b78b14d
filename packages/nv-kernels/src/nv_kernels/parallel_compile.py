"""ParallelTritonCompile: compile the Triton kernels a stretch of code would launch, on a pool of threads, without
running them.

An engine meets most of its kernel variants while it starts: the first prefill, one eager forward per CUDA-graph
size. Compiled one after the other, an empty Triton cache makes a start two to three times longer. Triton's
compiler spends most of a compile in its MLIR passes and in ptxas (a subprocess), outside the GIL, so compiles on
threads overlap.

Inside `with ParallelTritonCompile(device) as compile_pass:`, every Triton launch becomes a compile request:
Triton's async-compile mode (`triton.runtime._async_compile.AsyncCompileMode`, triton >= 3.4) hands the compile to
the pool and the launch returns at once, without running the kernel, so the kernel's outputs keep whatever their
memory held. Leaving the block waits for every compile and puts the kernels in Triton's caches (in memory and on
disk); code that then runs for real finds them compiled. A compile that fails is dropped; the real launch later
compiles it again and raises there.

Only for a pass whose results are thrown away and that never uses a computed value as an index, a size or a
probability (a model body on staged dummy inputs): its floats are garbage. `compile_pass.active` is False off
CUDA, under the Triton interpreter, where Triton lacks the mode, or with NV_PARALLEL_COMPILE=0 (nv_kernels.envs,
read as each block opens): run nothing then.
While a pass is open, no other thread may launch Triton kernels (the launch path is switched for the process).

`ParallelTritonCompile.ahead(device, passes)` is what a start calls: with a warm cache a compile-only pass costs
its forwards (~1 s for an engine's graph sizes) and saves nothing, so one pass runs alone as a probe and the
rest only when the probe compiled something new. Cheapest first: the probe is the first pass that meets a kernel
this process has not compiled yet.
"""
from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from nv_kernels import envs
from nv_kernels.jit_watch import TritonCompileWatch

logger = logging.getLogger(__name__)


class CompileAheadReport(NamedTuple):
    compiled: int       # compiles handed to the pool (from the disk cache or new)
    new_variants: int   # of those, variants the disk cache did not hold before
    seconds: float
    probe_only: bool    # the probe compiled nothing new (a warm cache): the passes after it were skipped


class ParallelTritonCompile:
    def __init__(self, device: torch.device, max_workers: int | None = None) -> None:
        self.device = device
        self.max_workers = max_workers or min(32, os.cpu_count() or 1)
        self.active = False
        self.requested = 0          # compiles handed to the pool (after the block: how many ran)
        self._executor: ThreadPoolExecutor | None = None
        self._mode: Any = None
        self._jit_class: Any = None
        self._run: Any = None

    @classmethod
    def ahead(cls, device: torch.device, passes: Sequence[Callable[[], object]],
              what: str = "these passes") -> CompileAheadReport | None:
        """Run `passes` (callables that launch kernels) compile-only. They run one at a time until one hands a
        compile to the pool (the others found their kernels in this process's memory): that one is the probe. If
        the probe compiled no variant the disk cache lacked, the cache is warm and the rest is skipped; else the
        rest runs in one block. Logs the outcome at INFO (`what`: whose kernels). None where a pass cannot run
        (nothing ran) or a pass raised (logged).
        One process's decision: ranks whose passes hold collectives (tensor parallelism) must not call this, as
        one rank could skip passes another runs."""
        start = time.perf_counter()
        try:
            report = cls._ahead(device, passes, start)
        except Exception as exc:   # a speed-up only: the real launches compile whatever is missing, one at a time
            logger.warning("compiling Triton kernels ahead failed (%s: %s); they compile as they launch",
                           type(exc).__name__, exc)
            return None
        if report is not None:
            logger.info("Triton kernels of %s: %d compiled ahead (%d new) in %.1f s%s", what, report.compiled,
                        report.new_variants, report.seconds, " (cache warm: probe only)" * report.probe_only)
        return report

    @classmethod
    def _ahead(cls, device: torch.device, passes: Sequence[Callable[[], object]],
               start: float) -> CompileAheadReport | None:
        probed, after_probe = 0, passes[:0]
        # one watch over the passes up to the probe: those before it compiled nothing, so wrote nothing to disk
        with TritonCompileWatch() as watch:
            for at, compile_pass in enumerate(passes, 1):
                with cls(device) as probe:
                    if not probe.active:
                        return None
                    compile_pass()
                probed = probe.requested
                if probed:
                    after_probe = passes[at:]
                    break
        if not probed:
            return CompileAheadReport(0, 0, time.perf_counter() - start, probe_only=False)
        if not watch.variants:
            return CompileAheadReport(probed, 0, time.perf_counter() - start, probe_only=True)
        with TritonCompileWatch() as rest_watch, cls(device) as rest:
            for later in after_probe:
                later()
        return CompileAheadReport(probed + rest.requested, len(watch.variants) + len(rest_watch.variants),
                                  time.perf_counter() - start, probe_only=False)

    def _supported(self) -> bool:
        if not envs.nv_parallel_compile() or self.device.type != "cuda" or envs.triton_interpret():
            return False
        try:
            from triton.runtime import _async_compile  # noqa: F401
            from triton.runtime.jit import JITFunction
        except ImportError:
            return False
        parameters = inspect.signature(JITFunction.run).parameters
        return "grid" in parameters and "warmup" in parameters

    def __enter__(self) -> ParallelTritonCompile:
        if not self._supported():
            return self
        from triton.runtime._async_compile import AsyncCompileMode
        from triton.runtime.jit import JITFunction

        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="nv-triton-compile")
        self._mode = AsyncCompileMode(self._executor, ignore_errors=True)
        self._mode.__enter__()
        self._jit_class, self._run = JITFunction, JITFunction.run
        run = self._run

        def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            # warmup=True: Triton binds the arguments and compiles (here: submits the compile), never launches
            return run(self, *args, grid=grid, warmup=True, **kwargs)

        setattr(JITFunction, "run", compile_only)   # noqa: B010  (the class's method, for every kernel)
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        setattr(self._jit_class, "run", self._run)   # noqa: B010
        self.active = False
        executor, self._executor = self._executor, None
        try:
            self.requested = len(self._mode.raw_futures)
            self._mode.__exit__(*exc)      # waits for every compile and installs the kernels
        finally:
            if executor is not None:
                executor.shutdown(wait=True)
