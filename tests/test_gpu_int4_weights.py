"""INT4 weights end to end on a CUDA GPU (pytest -m gpu), at the Qwen3-0.6B shape with random bf16 weights: AWQ and
GPTQ checkpoints (tests/int4_checkpoints.py) and online `quantization="awq"` give greedy outputs within vLLM's
check_logprobs_close (top-5) of the model they stand for, a bf16 checkpoint holding the dequantized weights. The
prompts run as a batch (prefill tiles, decode batches of 4: tensor cores with split K) and alone (the one-row GEMV),
with CUDA graphs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_compare import check_logprobs_close, nv_with_logprobs
from int4_checkpoints import write_dequantized_checkpoint, write_int4_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOP_K = 5


def generate(model: Path, **llm_kwargs) -> list:
    from nv_engine import LLM, SamplingParams

    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 10000, (n,), generator=gen).tolist()} for n in (5, 40, 200, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=TOP_K, ignore_eos=True)
    with LLM(str(model), max_model_len=1024, gpu_memory_utilization=0.6, **llm_kwargs) as llm:
        batch = nv_with_logprobs(llm.generate(prompts, params, use_tqdm=False))
        alone = nv_with_logprobs(llm.generate(prompts[:1], params, use_tqdm=False))
    return batch + alone


@pytest.fixture(scope="module")
def bf16_dir() -> Path:
    from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint

    model = nv_cache_dir() / "bench-random-qwen3-0.6b-bf16"          # shared with the benchmarks
    if not list(Path(model).glob("*.safetensors")):
        write_random_checkpoint(model, "qwen3-0.6b", dtype="bfloat16")
    return Path(model)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_checkpoints_and_online_awq_are_close_to_their_dequantized_model(
        bf16_dir: Path, tmp_path_factory: pytest.TempPathFactory, method: str) -> None:
    reference = generate(write_dequantized_checkpoint(bf16_dir, tmp_path_factory.mktemp("dequantized"), method))
    checkpoint = generate(write_int4_checkpoint(bf16_dir, tmp_path_factory.mktemp(method), method))
    check_logprobs_close(reference, checkpoint, f"dequantized {method}", f"{method} checkpoint")
    if method == "awq":
        check_logprobs_close(reference, generate(bf16_dir, quantization="awq"), "dequantized awq", "online awq")
