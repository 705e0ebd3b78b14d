"""All-reduce time for one decode step's tensor-parallel traffic: NCCL against nv's symmetric-memory
all-reduce (nv_layers.custom_all_reduce), each timed inside a CUDA graph (as decode steps run) and eagerly.

  python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/allreduce_bench.py --hidden 4096 --layers 36

A Qwen3 decoder layer all-reduces twice per forward (after o_proj and after down_proj), each a
[batch, hidden] tensor in bf16. Prints, per batch size, the median time of one all-reduce for each
method and the total per decode step (2 x layers all-reduces), and one JSON line per size.
"""
import argparse
import functools
import json
import os

import torch
import torch.distributed as dist

from nv_layers.parallel_state import custom_all_reduce, init_custom_all_reduce

GRAPH_OPS = 20   # all-reduces captured in one graph (a replay's launch cost is spread over them)


def _median_ms(fn, iters: int = 50) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def _in_graph(op, x: torch.Tensor) -> float:
    """Median ms of one `op(x)` replayed from a graph of GRAPH_OPS of them."""
    op(x)                                    # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_OPS):
            op(x)
    return _median_ms(graph.replay) / GRAPH_OPS


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256,512,1024")
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    init_custom_all_reduce(device, torch.bfloat16)
    custom = custom_all_reduce()
    if rank == 0 and custom is None:
        print("symmetric-memory all-reduce unavailable: NCCL only", flush=True)

    def nccl(x: torch.Tensor) -> None:
        dist.all_reduce(x)

    for batch in map(int, args.batches.split(",")):
        x = torch.zeros(batch, args.hidden, dtype=torch.bfloat16, device=device)   # sums stay finite
        row = {"batch": batch, "hidden": args.hidden, "bytes": x.numel() * 2,
               "nccl_graph_us": 1e3 * _in_graph(nccl, x), "nccl_eager_us": 1e3 * _median_ms(functools.partial(nccl, x))}
        if custom is not None and custom.can_reduce(x):
            row["custom_graph_us"] = 1e3 * _in_graph(custom.all_reduce, x)
            row["custom_eager_us"] = 1e3 * _median_ms(functools.partial(custom.all_reduce, x))
        if rank == 0:
            best = min(v for k, v in row.items() if k.endswith("_graph_us"))
            text = ", ".join(f"{k[:-3]} {v:.1f} us" for k, v in row.items() if k.endswith("_us"))
            print(f"all-reduce [{batch}, {args.hidden}] bf16: {text}; per decode step (2 x {args.layers} "
                  f"layers, best in a graph): {2 * args.layers * best / 1e3:.3f} ms", flush=True)
            print("JSON " + json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
