"""The headline workload through the `LLM` API, twice in one process: run 1 is the first timed run after the
engine starts (no warm-up: what a user's first batch sees), run 2 the second. Prints one JSON line.

    python3 benchmarks/headline_runs.py TAG [SHAPE] [NUM_PROMPTS] [KV_CACHE_DTYPE] [--step-times]

KV_CACHE_DTYPE: "auto" (default) or "fp8" / "fp8_e5m2" (the FP8 KV cache).

The result lists the Triton kernel variants compiled inside each timed run (`run1_triton_compiles`): JIT time that
the engine's start-up warm-up did not cover. --step-times also times every engine step of both runs (the two runs
schedule the same steps) and reports where run 1 spends more than run 2 (`step_times`: the sum of the excess,
the steps that carry most of it, and each run's first steps): what a cold run pays beyond a warm one; and the warm
run's step times summed per 100 steps (`warm_ms_per_window`): where in the run the time goes.
Run it with every package's src dir on PYTHONPATH (scripts/dev/compare_trees.sh does, for two trees). It falls
back to the module paths of trees from before nv_engine's regrouping (nv_engine.entrypoints.bench,
nv_engine.checkpoints), so an older commit can be measured with this same script."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch

try:
    from nv_engine.entrypoints.bench.throughput import make_workload
    from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint
except ImportError:   # trees before nv_engine's regrouping
    from nv_engine.checkpoints.random_model import nv_cache_dir, write_random_checkpoint  # type: ignore[no-redef]
    from nv_engine.entrypoints.bench import make_workload  # type: ignore[no-redef]
from nv_engine import LLM, SamplingParams


def compile_watch():
    """nv_kernels' TritonCompileWatch, or a stand-in yielding None for trees that lack it."""
    try:
        from nv_kernels.jit_watch import TritonCompileWatch
    except ImportError:
        return contextlib.nullcontext()
    return TritonCompileWatch()


class StepTimes:
    """The wall time of every engine step (`LLMEngine.step`, as `LLM.generate` calls it), per timed run."""

    def __init__(self, llm: LLM) -> None:
        self.runs: list[list[float]] = []
        engine = llm.llm_engine
        step = engine.step

        def timed_step(*args, **kwargs):
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                if self.runs:
                    self.runs[-1].append(time.perf_counter() - start)

        engine.step = timed_step

    def start_run(self) -> None:
        self.runs.append([])

    def cold_excess(self, top: int = 8, first: int = 5) -> dict:
        """Run 1 against run 2, step by step: the summed excess (ms, steps where run 1 was slower), the `top` steps
        with the largest excess as [index, run 1 ms, run 2 ms], each run's `first` steps (ms) and the warm run's
        window_sums."""
        cold, warm = self.runs[0], self.runs[1]
        pairs = list(zip(cold, warm, strict=False))
        excess = sorted(range(len(pairs)), key=lambda i: pairs[i][1] - pairs[i][0])[:top]
        return {"steps": [len(cold), len(warm)],
                "excess_ms": round(1000 * sum(max(a - b, 0.0) for a, b in pairs), 1),
                "largest": [[i, round(1000 * pairs[i][0], 2), round(1000 * pairs[i][1], 2)] for i in excess],
                "first_ms": [[round(1000 * t, 2) for t in run[:first]] for run in (cold, warm)],
                "warm_ms_per_window": self.window_sums(warm)}

    @staticmethod
    def window_sums(run: list[float], window: int = 100) -> list[float]:
        """The run's step times summed over each `window` consecutive steps (ms): where in the run the time goes,
        e.g. the tail of few long sequences against the full batch."""
        return [round(1000 * sum(run[i:i + window]), 1) for i in range(0, len(run), window)]


def main() -> None:
    argv = [a for a in sys.argv[1:] if not a.startswith("--")]
    step_times = "--step-times" in sys.argv[1:]
    tag = argv[0]
    shape = argv[1] if len(argv) > 1 else "qwen3-0.6b"
    num_prompts = int(argv[2]) if len(argv) > 2 else 256
    kv_cache_dtype = argv[3] if len(argv) > 3 else "auto"
    model = str(nv_cache_dir() / f"bench-random-{shape}-bf16")
    if not (Path(model) / "model.safetensors").exists():
        try:
            write_random_checkpoint(model, shape, dtype="bfloat16", device="cuda")   # drawn on the GPU: seconds
        except TypeError:   # trees whose writer draws on the CPU only
            write_random_checkpoint(model, shape, dtype="bfloat16")
    started = time.perf_counter()
    kv_kwargs = {} if kv_cache_dtype == "auto" else {"kv_cache_dtype": kv_cache_dtype}   # old trees lack it
    llm = LLM(model, max_model_len=4096, **kv_kwargs)
    result: dict[str, float | str] = {"tag": tag, "kv_cache_dtype": kv_cache_dtype,
                                      "start_s": time.perf_counter() - started}
    vocab = llm.config.hf_config.vocab_size
    work = make_workload(num_prompts, (100, 1024), (100, 1024), max_token_id=min(10000, vocab - 1))
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in work.max_tokens]
    timer = StepTimes(llm) if step_times else None
    for run in (1, 2):
        if timer is not None:
            timer.start_run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        with compile_watch() as jit:   # Triton variants compiled inside the timed run (cold's JIT cost)
            start = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in work.prompts], params, use_tqdm=False)
            wall = time.perf_counter() - start
        if jit is not None:
            result[f"run{run}_triton_compiles"] = jit.variants
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        result[f"run{run}_output_tok_s"] = tokens / wall
        result[f"run{run}_wall_s"] = wall
    if timer is not None:
        result["step_times"] = timer.cold_excess()   # type: ignore[assignment]
    print("RESULT", json.dumps(result), flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main()
