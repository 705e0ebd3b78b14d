"""NCCL all-reduce time for one decode step's tensor-parallel traffic.

  python3 -m torch.distributed.run --nproc-per-node 2 scripts/allreduce_bench.py --hidden 4096 --layers 36

A Qwen3 decoder layer all-reduces twice per forward (after o_proj and after down_proj), each a
[batch, hidden] tensor in bf16. Prints the median time of one all-reduce per batch size and the
total per decode step (2 x layers all-reduces).
"""
import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--batches", default="1,16,64,256")
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    for batch in map(int, args.batches.split(",")):
        x = torch.randn(batch, args.hidden, dtype=torch.bfloat16, device="cuda")
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dist.all_reduce(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        med = sorted(times)[len(times) // 2]
        if rank == 0:
            print(f"all-reduce [{batch}, {args.hidden}] bf16: {med * 1e3:.1f} us; per decode step "
                  f"(2 x {args.layers} layers): {2 * args.layers * med:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
