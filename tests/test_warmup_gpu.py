"""No Triton compile after the engine has started: LLMEngine.__init__ runs warmup_steps.WarmupSteps,
so a mixed set of requests (greedy, sampled, top-k/top-p/min-p, penalties, logprobs, prompt
logprobs, seeds, n=2, a chunked long prompt, prefix-cache hits, shrinking decode batches) compiles
no new kernel variant. In a fresh process with an empty Triton cache, so neither an earlier test's
in-memory kernels nor a warm disk cache can hide a variant the warm-up missed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = textwrap.dedent('''
    import json, random, sys, time
    from nv_engine import LLM, SamplingParams
    from nv_engine.model_loader.random_model import write_random_checkpoint
    from nv_kernels.jit_watch import TritonCompileWatch

    model = write_random_checkpoint(sys.argv[1], "qwen3-0.6b", dtype="bfloat16")
    with TritonCompileWatch() as at_start:
        start = time.perf_counter()
        llm = LLM(str(model), gpu_memory_utilization=0.5, max_model_len=2048, max_num_batched_tokens=1024,
                  max_num_seqs=64)
        start_s = time.perf_counter() - start
    rng = random.Random(0)

    def prompt(n):
        return {"prompt_token_ids": [rng.randrange(10000) for _ in range(n)]}

    def p(**kw):
        return SamplingParams(ignore_eos=True, **kw)

    mixed = [
        (prompt(37), p(temperature=0.0, max_tokens=20)),
        (prompt(100), p(temperature=0.8, max_tokens=33)),
        (prompt(5), p(temperature=0.7, top_k=20, max_tokens=17)),
        (prompt(64), p(temperature=0.9, top_p=0.9, min_p=0.05, max_tokens=9)),
        (prompt(300), p(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1,
                        max_tokens=12)),
        (prompt(50), p(temperature=0.0, logprobs=5, max_tokens=8)),
        (prompt(80), p(temperature=0.0, prompt_logprobs=3, max_tokens=4)),
        (prompt(1900), p(temperature=0.6, max_tokens=40)),              # chunked: longer than the budget
        (prompt(33), p(temperature=0.8, n=2, seed=7, max_tokens=25)),
        (prompt(1), p(temperature=0.0, max_tokens=3)),
    ] + [(prompt(rng.randint(1, 700)), p(temperature=0.6, max_tokens=rng.randint(1, 60))) for _ in range(53)]
    with TritonCompileWatch() as serving:
        for batch in (mixed[:1], mixed[:10], mixed):
            llm.generate([q for q, _ in batch], [s for _, s in batch], use_tqdm=False)
        shared = [{"prompt_token_ids": q["prompt_token_ids"] + [1, 2, 3]} for q, _ in mixed[:20]]   # prefix hits
        llm.generate(shared, p(temperature=0.8, top_k=5, max_tokens=7), use_tqdm=False)
    llm.shutdown()
    print("RESULT " + json.dumps({"start_s": start_s, "start_variants": len(at_start.variants),
                                  "serving_variants": serving.variants}))
''')


def test_no_triton_compile_after_engine_start(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "model")], capture_output=True, text=True,
                         timeout=1200, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    print(f"engine start {result['start_s']:.1f} s with an empty Triton cache, "
          f"{result['start_variants']} variants compiled at start")
    assert result["start_variants"] > 0                     # the watch sees compiles (the cache is fresh)
    assert result["serving_variants"] == []
