"""The requests `nv bench serve` sends: the headline workload (the same generator as `nv bench throughput`),
random token-id prompts of a given length (vLLM's `random` dataset shape), or text prompts from a JSONL file
(each line may add request fields: a JSON schema, ignore_eos, ...)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nv_engine.entrypoints.bench.serve_types import BenchServeRequest
from nv_engine.entrypoints.bench.throughput import make_workload


class BenchServeDataset:
    """A list of BenchServeRequests and the name of where they came from."""

    def __init__(self, name: str, requests: list[BenchServeRequest]) -> None:
        if not requests:
            raise ValueError(f"the {name} dataset has no requests")
        self.name = name
        self.requests = requests

    @property
    def has_token_prompts(self) -> bool:
        return any(not isinstance(r.prompt, str) for r in self.requests)

    @classmethod
    def headline(cls, num_prompts: int, seed: int, max_token_id: int) -> BenchServeDataset:
        """`nv bench throughput`'s requests (with its defaults: the 256 of BENCHMARKS.md)."""
        work = make_workload(num_prompts, max_token_id=max_token_id, random_seed=seed)
        return cls("headline", [BenchServeRequest(list(p), m, len(p))
                                for p, m in zip(work.prompts, work.max_tokens, strict=True)])

    @classmethod
    def random(cls, num_prompts: int, seed: int, max_token_id: int, input_len: int, output_len: int,
               range_ratio: float) -> BenchServeDataset:
        """Lengths uniform in [len * (1 - ratio), len * (1 + ratio)], ids uniform in [0, max_token_id]."""
        if not 0.0 <= range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
        if input_len < 1 or output_len < 1:
            raise ValueError("--random-input-len and --random-output-len must be at least 1")
        rng = np.random.default_rng(seed)
        in_lens = rng.integers(max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio)) + 1,
                               num_prompts)
        out_lens = rng.integers(max(1, int(output_len * (1 - range_ratio))),
                                int(output_len * (1 + range_ratio)) + 1, num_prompts)
        requests = []
        for n_in, n_out in zip(in_lens.tolist(), out_lens.tolist(), strict=True):
            ids = rng.integers(0, max_token_id + 1, n_in).tolist()
            requests.append(BenchServeRequest(ids, n_out, n_in))
        return cls("random", requests)

    @classmethod
    def jsonl(cls, path: str, num_prompts: int, default_output_len: int) -> BenchServeDataset:
        """One JSON object a line with a "prompt" (text) and optionally "max_tokens" or "output_len", and
        "extra_body" (an object: more request fields, as the OpenAI client's extra_body, merged over the
        benchmark's own); the first num_prompts lines (cycled when the file has fewer)."""
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        found = []
        for number, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} line {number}: not JSON ({exc})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path} line {number}: needs a text \"prompt\" field")
            output_len = row.get("max_tokens", row.get("output_len", default_output_len))
            if not isinstance(output_len, int) or output_len < 1:
                raise ValueError(f"{path} line {number}: max_tokens/output_len must be a positive integer")
            extra_body = row.get("extra_body")
            if extra_body is not None and not isinstance(extra_body, dict):
                raise ValueError(f"{path} line {number}: extra_body must be a JSON object")
            found.append(BenchServeRequest(row["prompt"], output_len, extra_body=extra_body))
        if not found:
            raise ValueError(f"{path} holds no prompt")
        return cls("jsonl", [found[i % len(found)] for i in range(num_prompts)])
