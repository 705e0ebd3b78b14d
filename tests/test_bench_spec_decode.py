"""benchmarks/bench_spec_decode.py: its step counts and the drafting-step cost derived from them."""
from __future__ import annotations

import random

import pytest
from repo_scripts import load_script

from nv_engine import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "adaptive_draft_length": False}


@pytest.fixture(scope="module")
def bench_spec_decode():
    return load_script("benchmarks/bench_spec_decode.py")


def test_draft_step_cost_in_plain_steps(bench_spec_decode) -> None:
    # 10 steps in 14 ms, 4 of them drafting, plain steps of 1 ms: the 6 others took 6 ms, so a drafting step 2 ms
    assert bench_spec_decode.draft_step_cost(0.014, 10, 4, 0.001) == pytest.approx(2.0)
    assert bench_spec_decode.draft_step_cost(0.014, 10, 0, 0.001) is None


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ngram"])
def test_step_counter_counts_steps_and_drafting_steps(bench_spec_decode, tiny_qwen3_dir, speculative) -> None:
    llm = LLM(str(tiny_qwen3_dir), speculative_config=NGRAM if speculative else None)
    try:
        counter = bench_spec_decode.StepCounter(llm)
        prompts = bench_spec_decode.repetitive_prompts(llm, 2, 48, True, random.Random(0))
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        seconds, drafted, accepted, steps, draft_steps = bench_spec_decode.timed(llm, counter, prompts, params)
    finally:
        llm.shutdown()
    assert seconds > 0 and counter.steps >= 2 * steps     # timed runs twice and returns the second
    if not speculative:
        assert (steps, draft_steps, drafted) == (16, 0, 0)    # one prefill step that samples, 15 decodes
    else:
        assert 0 < draft_steps <= steps <= 16 and drafted >= draft_steps and accepted > 0
