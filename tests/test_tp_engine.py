"""LLM with tensor_parallel_size=2 on CPU (gloo) against TP=1: same greedy tokens, close logprobs.

Covers both ways of running TP=2: spawned workers (rank 0 in this process, and all ranks in
workers when this process already hosts a group) and `torchrun --nproc-per-node 2`, with async
scheduling (the default at every TP size: each rank feeds its own sampled ids into the next step)
and without it. Seeded random sampling at TP=2 draws TP=1's tokens: a rank that sampled other ids
than rank 0 would feed them to its next step and the outputs would drift. Structured outputs at TP=2
(every rank samples with the bitmask rank 0's engine filled while the forward ran) give TP=1's tokens.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from nv_engine import LLM, SamplingParams, StructuredOutputsParams
from nv_engine.executor.testing import run_torchrun

PROMPTS = [
    "The quick brown fox jumps",
    "Hello, world! How are you today? Paged attention stores keys",
    "1 2 3",
    "def main():\n    print(",
]
# A small batch budget forces chunked prefill and mixed prefill/decode steps.
ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=16, seed=0)
MAX_TOKENS = 32


def _params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)


def _seeded_params() -> list[SamplingParams]:
    """Random sampling with per-request seeds (with top-k / top-p, with logit_bias), greedy for the last."""
    return [SamplingParams(temperature=1.0, seed=1, max_tokens=MAX_TOKENS, ignore_eos=True),
            SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=2, max_tokens=MAX_TOKENS, ignore_eos=True),
            SamplingParams(temperature=1.2, seed=3, max_tokens=MAX_TOKENS, ignore_eos=True, logit_bias={5: 2.0}),
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)]


GRAMMAR_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "tags"],
                  "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                 "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["a", "bb", "ccc"]}}}}


def _run_grammar(llm: LLM) -> list[tuple[list[int], str | None]] | None:
    """JSON-schema outputs, seeded and greedy (None without xgrammar)."""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return None
    params = [SamplingParams(temperature=1.0 if i % 2 else 0.0, seed=i, max_tokens=2 * MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(json=GRAMMAR_SCHEMA))
              for i in range(len(PROMPTS))]
    return [(list(out.outputs[0].token_ids), out.outputs[0].finish_reason)
            for out in llm.generate(PROMPTS, params, use_tqdm=False)]


def _run_seeded(llm: LLM) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, _seeded_params(), use_tqdm=False)]


def _run(llm: LLM) -> list[tuple[list[int], list[float]]]:
    outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    results = []
    for out in outputs:
        completion = out.outputs[0]
        chosen = [step[tok].logprob for tok, step in zip(completion.token_ids, completion.logprobs, strict=True)]
        results.append((list(completion.token_ids), chosen))
    return results


def _assert_same(reference, got) -> None:
    for (ref_ids, ref_lp), (ids, lp) in zip(reference, got, strict=True):
        assert ids == ref_ids
        assert len(ids) == MAX_TOKENS
        assert max(abs(a - b) for a, b in zip(lp, ref_lp, strict=True)) < 1e-4


@pytest.fixture(scope="module")
def tp1_results(tiny_qwen3_dir):
    """TP=1's (greedy tokens and logprobs, seeded-sampling tokens)."""
    with LLM(str(tiny_qwen3_dir), tensor_parallel_size=1, **ENGINE_ARGS) as llm:
        greedy, seeded, grammar = _run(llm), _run_seeded(llm), _run_grammar(llm)
    assert len({tuple(row) for row in seeded}) == len(PROMPTS)
    assert grammar is None or all(reason == "stop" for _, reason in grammar)
    return greedy, seeded, grammar


@pytest.fixture(scope="module")
def reference(tp1_results):
    return tp1_results[0]


@pytest.fixture(scope="module")
def seeded_reference(tp1_results):
    return tp1_results[1]


def test_tp2_spawned_workers_match_tp1(tiny_qwen3_dir, reference, seeded_reference, tp1_results):
    with LLM(str(tiny_qwen3_dir), tensor_parallel_size=2, **ENGINE_ARGS) as llm:
        executor = llm.llm_engine.executor
        assert executor.world_size == 2 and executor.driver_in_process
        assert llm.llm_engine.async_scheduling          # the default at TP > 1 too
        _assert_same(reference, _run(llm))
        assert _run_seeded(llm) == seeded_reference
        assert _run_grammar(llm) == tp1_results[2]
        # a second TP engine in this process keeps all its ranks in worker processes (and here
        # steps synchronously)
        with LLM(str(tiny_qwen3_dir), tensor_parallel_size=2, async_scheduling=False, **ENGINE_ARGS) as other:
            assert not other.llm_engine.executor.driver_in_process
            assert not other.llm_engine.async_scheduling
            _assert_same(reference, _run(other))
            assert _run_seeded(other) == seeded_reference
        _assert_same(reference, _run(llm))     # the first engine is untouched


TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests_dir!r})
    from test_tp_engine import ENGINE_ARGS, LLM, _run, _run_seeded

    llm = LLM(sys.argv[1], tensor_parallel_size=2, **ENGINE_ARGS)
    assert llm.llm_engine.async_scheduling
    results = _run(llm)
    seeded = _run_seeded(llm)
    executor = llm.llm_engine.executor
    print(f"rank {{executor.rank}} done", flush=True)
    if executor.is_driver:
        print("RESULTS " + json.dumps(results), flush=True)
        print("SEEDED " + json.dumps(seeded), flush=True)
    llm.shutdown()
""")


def test_tp2_under_torchrun_matches_tp1(tiny_qwen3_dir, reference, seeded_reference, tmp_path):
    script = tmp_path / "tp_engine_script.py"
    script.write_text(TORCHRUN_SCRIPT.format(tests_dir=str(Path(__file__).parent)))
    proc = run_torchrun(str(script), str(tiny_qwen3_dir))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    lines = [line for line in out.splitlines() if line.startswith("RESULTS ")]
    assert len(lines) == 1, out                      # only rank 0 reports
    _assert_same(reference, [tuple(r) for r in json.loads(lines[0][len("RESULTS "):])])
    seeded = [line for line in out.splitlines() if line.startswith("SEEDED ")]
    assert len(seeded) == 1 and json.loads(seeded[0][len("SEEDED "):]) == seeded_reference, out
