"""Tensor parallelism on CPU: 2 processes with gloo.

Each parallel layer's output at TP=2 equals the unsharded computation, and whole tiny Qwen3 / Qwen2
forwards (prefill, prefix hit, chunked prefill, decode over the paged cache) at TP=2 equal TP=1.
The ranks run this file as a script (`python test_tp_layers.py RANK ...`): pytest imports test files
under a name spawned children cannot import, so they are started as plain subprocesses with a
file:// rendezvous (no port needed).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

WORLD = 2
TOL = 1e-5


def _gather(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def layer_checks() -> dict[str, float]:
    """Max abs difference between each TP layer and its unsharded computation (runs on every rank)."""
    from nv_layers import (
        ColumnParallelLinear,
        ForwardContext,
        MergedColumnParallelLinear,
        ParallelLMHead,
        QKVParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        forward_context,
    )

    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(0)                     # same full tensors on every rank

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    out: dict[str, float] = {}
    x = rand(5, 16)
    w, b = rand(12, 16), rand(12)
    col = ColumnParallelLinear(16, 12, bias=True)
    col.weight.weight_loader(col.weight, w)
    col.bias.weight_loader(col.bias, b)
    out["column"] = (_gather(col(x)) - F.linear(x, w, b)).abs().max().item()

    w, b = rand(8, 16), rand(8)
    row = RowParallelLinear(16, 8, bias=True)
    row.weight.weight_loader(row.weight, w)
    row.bias.weight_loader(row.bias, b)
    out["row"] = (row(x.chunk(WORLD, -1)[rank]) - F.linear(x, w, b)).abs().max().item()

    gate, up = rand(10, 16), rand(10, 16)
    merged = MergedColumnParallelLinear(16, [10, 10])
    merged.weight.weight_loader(merged.weight, gate, 0)
    merged.weight.weight_loader(merged.weight, up, 1)
    g, u = merged(x).chunk(2, -1)
    out["merged"] = max((_gather(g) - F.linear(x, gate)).abs().max().item(),
                        (_gather(u) - F.linear(x, up)).abs().max().item())

    for name, kv_heads in (("qkv", 2), ("qkv_replicated_kv", 1)):
        d = 4
        wq, wk, wv = rand(4 * d, 16), rand(kv_heads * d, 16), rand(kv_heads * d, 16)
        qkv = QKVParallelLinear(16, d, 4, kv_heads, bias=False)
        for sid, wt in (("q", wq), ("k", wk), ("v", wv)):
            qkv.weight.weight_loader(qkv.weight, wt, sid)
        q, k, v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1)
        ks, vs = (_gather(k), _gather(v)) if kv_heads >= WORLD else (k, v)
        out[name] = max((_gather(q) - F.linear(x, wq)).abs().max().item(),
                        (ks - F.linear(x, wk)).abs().max().item(), (vs - F.linear(x, wv)).abs().max().item())

    table, ids = rand(11, 16), torch.tensor([0, 4, 5, 6, 10, 3])          # 11 rows: padded shards
    emb = VocabParallelEmbedding(11, 16)
    emb.weight.weight_loader(emb.weight, table)
    out["embedding"] = (emb(ids) - F.embedding(ids, table)).abs().max().item()

    head = ParallelLMHead(11, 16)
    head.weight.weight_loader(head.weight, table)
    ctx = ForwardContext(is_decode=False, slot_mapping=torch.zeros(5), seq_lens=torch.zeros(2),
                         block_tables=torch.zeros(2, 1), cu_seqlens_q=torch.tensor([0, 2, 5]), max_seqlen_q=3,
                         max_seqlen_k=3, logits_indices=torch.tensor([1, 4]), backend=None)
    with forward_context(ctx):
        logits = head(x)
    out["lm_head"] = (logits - x[[1, 4]] @ table.T).abs().max().item() if logits.shape == (2, 11) else float("inf")

    # tp_all_reduce on CPU: no symmetric-memory all-reduce (set-up says so on every rank), gloo's sum
    from nv_layers.parallel_state import custom_all_reduce, init_custom_all_reduce, tp_all_reduce

    y = rand(3, 8) * (rank + 1)                                   # a different tensor on each rank
    expected = y.clone()
    dist.all_reduce(expected)
    if init_custom_all_reduce(torch.device("cpu"), torch.float32) or custom_all_reduce() is not None:
        out["all_reduce_cpu"] = float("inf")
    else:
        got = tp_all_reduce(y)
        out["all_reduce_cpu"] = (got - expected).abs().max().item() if got is y else float("inf")
    return out


def model_scenario(path: str) -> list[torch.Tensor]:
    """Logits of a fixed batched prefill / prefix-hit / chunked / decode schedule (TP from dist state)."""
    from transformers import AutoConfig

    from nv_kernels import get_backend
    from nv_layers import load_safetensors
    from nv_layers.testing import PagedDriver
    from nv_qwen3 import get_model_class

    config = AutoConfig.from_pretrained(path)
    model = get_model_class(config)(config).eval()
    load_safetensors(model, path)
    driver = PagedDriver(model, num_blocks=32, block_size=4, backend=get_backend("torch"))
    gen = torch.Generator().manual_seed(7)
    a, c = torch.randint(0, 384, (13,), generator=gen).tolist(), torch.randint(0, 384, (10,), generator=gen).tolist()
    driver.add(0, a)
    driver.add(2, c)
    results = [driver.step([(0, 13), (2, 6)])]
    driver.append(0, int(results[-1][0].argmax()))
    driver.add(1, a[:8] + [1, 2, 3], share_from=0, num_shared_blocks=2)
    results.append(driver.step([(0, 1), (1, 3), (2, 4)]))
    for i, row in enumerate(results[-1]):
        driver.append(i, int(row.argmax()))
    results.append(driver.step([(0, 1), (1, 1), (2, 1)]))
    return results


def _worker(rank: int, init_file: str, out_dir: str, paths: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        result = {"layers": layer_checks(), "models": {p: model_scenario(p) for p in paths}}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp2_results(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_dir: Path, tiny_qwen3_untied_dir: Path,
                tiny_qwen2_dir: Path) -> dict:
    out_dir = tmp_path_factory.mktemp("tp2")
    paths = [str(tiny_qwen3_dir), str(tiny_qwen3_untied_dir), str(tiny_qwen2_dir)]
    cmd = [sys.executable, __file__, str(out_dir / "rendezvous"), str(out_dir), *paths]
    procs = [subprocess.Popen([*cmd[:2], str(rank), *cmd[2:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(WORLD)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    return {rank: torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD)}


@pytest.mark.parametrize("layer", ["column", "row", "merged", "qkv", "qkv_replicated_kv", "embedding", "lm_head",
                                   "all_reduce_cpu"])
def test_parallel_layer_equals_unsharded(tp2_results: dict, layer: str) -> None:
    for rank in range(WORLD):
        assert tp2_results[rank]["layers"][layer] < TOL, (rank, layer)


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_qwen3_untied_dir", "tiny_qwen2_dir"])
def test_model_tp2_equals_tp1(tp2_results: dict, fixture: str, request: pytest.FixtureRequest) -> None:
    path = str(request.getfixturevalue(fixture))
    reference = model_scenario(path)                        # this process: no process group -> TP=1
    for rank in range(WORLD):
        got = tp2_results[rank]["models"][path]
        assert [g.shape for g in got] == [r.shape for r in reference]
        err = max((g - r).abs().max().item() for g, r in zip(got, reference, strict=True))
        assert err < TOL, (rank, err)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:])
