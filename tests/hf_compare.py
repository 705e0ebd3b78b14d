"""Shared helpers for comparing nv against HF transformers (importable from tests: pytest.ini puts
tests/ on sys.path)."""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

TokensAndLogprobs = tuple[list[int], list[dict[int, float]]]


def random_prompts(lengths: Sequence[int], seed: int = 0, vocab: int = 384) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, n).tolist() for n in lengths]


def load_hf(model_dir, dtype=torch.float32, device="cpu", **kwargs):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kwargs)
    except TypeError:  # transformers < 4.56
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, **kwargs)
    return model.to(device).eval()


@torch.no_grad()
def hf_greedy(model, prompt: list[int], num_tokens: int) -> tuple[list[int], torch.Tensor]:
    """HF greedy decoding with its own KV cache: (tokens, log_softmax rows [num_tokens, V])."""
    device = next(model.parameters()).device
    out = model(torch.tensor([prompt], device=device), use_cache=True)
    tokens, logprobs = [], []
    for i in range(num_tokens):
        lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        tokens.append(int(lp.argmax()))
        logprobs.append(lp.cpu())
        if i + 1 < num_tokens:
            with warnings.catch_warnings():  # newer transformers renames past_key_values to cache
                warnings.simplefilter("ignore", FutureWarning)
                out = model(torch.tensor([[tokens[-1]]], device=device),
                            past_key_values=out.past_key_values, use_cache=True)
    return tokens, torch.stack(logprobs)


def check_logprobs_close(outputs_0: Sequence[TokensAndLogprobs], outputs_1: Sequence[TokensAndLogprobs],
                         name_0: str = "0", name_1: str = "1") -> None:
    """vLLM's rule (tests/models/utils.py): walk each pair of sequences; at the first differing
    token, each side's token must be in the other's top-k logprobs at that position; then stop
    comparing that pair (the continuations legitimately diverge)."""
    assert len(outputs_0) == len(outputs_1)
    for i, ((ids_0, lps_0), (ids_1, lps_1)) in enumerate(zip(outputs_0, outputs_1, strict=True)):
        for pos, (t0, t1) in enumerate(zip(ids_0, ids_1, strict=False)):
            if t0 == t1:
                continue
            assert t0 in lps_1[pos], (f"prompt {i}, token {pos}: {name_0} chose {t0}, not in {name_1}'s "
                                      f"top logprobs {lps_1[pos]}")
            assert t1 in lps_0[pos], (f"prompt {i}, token {pos}: {name_1} chose {t1}, not in {name_0}'s "
                                      f"top logprobs {lps_0[pos]}")
            break


def nv_with_logprobs(outputs) -> list[TokensAndLogprobs]:
    """RequestOutputs (logprobs requested) -> [(tokens, [{id: logprob}])] of the first completion."""
    return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in outputs]


def hf_with_logprobs(refs, k: int) -> list[TokensAndLogprobs]:
    """hf_greedy results -> [(tokens, [{id: logprob} of the top k])]."""
    result = []
    for tokens, lps in refs:
        top = lps.topk(k, dim=-1)
        rows = zip(top.values, top.indices, strict=True)  # per position: [k] values, [k] ids
        result.append((tokens, [dict(zip(ids.tolist(), vals.tolist(), strict=True)) for vals, ids in rows]))
    return result
