"""Simulated workload through the scheduler and the paged KV cache.

    python -m nv_kvcache.demo            # 64 requests with shared prefixes, a cache that forces preemption
    python -m nv_kvcache.demo --bench    # time schedule() + postprocess() at batch-256 decode
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from nv_kvcache.scheduler import Scheduler
from nv_kvcache.sequence import Sequence, StopRules
from nv_kvcache.testing import FakeModel, reference_output


def run_workload(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    model = FakeModel(vocab_size=args.vocab, seed=args.seed)
    eos = args.vocab - 1      # the fake model emits it about once per `vocab` tokens
    sched = Scheduler(num_blocks=args.num_blocks, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      max_model_len=args.max_model_len, enable_prefix_caching=not args.no_prefix_caching)
    system_prompts = [[rng.randrange(eos) for _ in range(rng.randrange(48, 160))] for _ in range(4)]
    seqs = []
    for _ in range(args.num_requests):
        prompt = rng.choice(system_prompts) + [rng.randrange(eos) for _ in range(rng.randrange(8, 64))]
        rules = StopRules(max_tokens=rng.randrange(16, 128), eos_token_ids=frozenset({eos}))
        seqs.append(Sequence(prompt, rules))
    # Requests arrive over the first steps, a few at a time. Objects made so far are long-lived:
    # freeze them so a full GC pass (milliseconds) does not land inside a step; an engine should
    # do the same after start-up.
    gc.collect()
    gc.freeze()
    arrivals = list(seqs)
    step_times: list[float] = []
    step = 0
    print(f"{len(seqs)} requests, cache {args.num_blocks} blocks x {args.block_size} tokens, "
          f"max_num_seqs {args.max_num_seqs}, budget {args.max_num_batched_tokens} tokens/step")
    print(f"{'step':>5} {'running':>7} {'waiting':>7} {'batch':>6} {'decodes':>7} {'usage':>6}")
    while arrivals or sched.has_unfinished():
        for _ in range(min(len(arrivals), 4)):
            sched.add(arrivals.pop(0))
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        sampled = model.step(out)
        t2 = time.perf_counter()
        sched.postprocess(out, sampled)
        step_times.append((t1 - t0) + (time.perf_counter() - t2))
        if step % args.print_every == 0:
            num_decodes = sum(1 for s in out.scheduled if s.num_new_tokens == 1 and s.samples)
            print(f"{step:>5} {sched.num_running:>7} {sched.num_waiting:>7} {out.num_batched_tokens:>6} "
                  f"{num_decodes:>7} {sched.block_manager.usage:>6.0%}")
        step += 1
    bm = sched.block_manager
    prompt_tokens = sum(s.num_prompt_tokens for s in seqs)
    output_tokens = sum(s.num_output_tokens for s in seqs)
    identical = all((s.output_token_ids, s.finish_reason)
                    == reference_output(s.prompt_token_ids, model, s.rules, args.max_model_len) for s in seqs)
    leaked = bm.num_used_blocks
    print(f"steps {step}, prompt tokens {prompt_tokens}, generated tokens {output_tokens}")
    print(f"prefix-cache hit rate {bm.hit_rate:.1%} of admitted tokens, preemptions {sched.num_preemptions}")
    print(f"schedule+postprocess per step: mean {statistics.mean(step_times) * 1e6:.0f} us, "
          f"max {max(step_times) * 1e6:.0f} us")
    print(f"finish reasons: {_count(s.finish_reason.value for s in seqs)}")
    print(f"outputs identical to undisturbed runs: {'yes' if identical else 'NO'}; "
          f"blocks still in use: {leaked}")
    gc.unfreeze()
    return 0 if identical and leaked == 0 else 1


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


def bench_decode(batch: int = 256, steps: int = 400, block_size: int = 16, prompt_len: int = 128,
                 seed: int = 0) -> dict[str, float]:
    """Microseconds of schedule() and postprocess() per pure-decode step at `batch` sequences."""
    rng = random.Random(seed)
    max_model_len = prompt_len + steps + 64
    blocks_per_seq = -(-max_model_len // block_size)
    sched = Scheduler(num_blocks=batch * blocks_per_seq, block_size=block_size, max_num_seqs=batch,
                      max_num_batched_tokens=max(8192, batch), max_model_len=max_model_len)
    for _ in range(batch):
        prompt = [rng.randrange(30000) for _ in range(prompt_len)]
        sched.add(Sequence(prompt, StopRules(max_tokens=steps + 32, eos_token_ids=frozenset({50000}))))
    while True:                                  # prefill until every sequence decodes
        out = sched.schedule()
        if out.is_pure_decode and len(out.scheduled) == batch:
            break
        sched.postprocess(out, [rng.randrange(30000) for _ in out.sampling])
    sampled = [rng.randrange(30000) for _ in range(batch)]
    sched_s, post_s = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        sched.postprocess(out, sampled)
        t1 = time.perf_counter()
        out = sched.schedule()
        t2 = time.perf_counter()
        if len(out.sampling) != batch:
            raise RuntimeError("the benchmark batch shrank")
        post_s.append(t1 - t0)
        sched_s.append(t2 - t1)
    sched.postprocess(out, sampled)
    total = sorted(a + b for a, b in zip(sched_s, post_s, strict=True))
    return {"batch": batch, "schedule_us": statistics.median(sched_s) * 1e6,
            "postprocess_us": statistics.median(post_s) * 1e6, "total_us": statistics.median(total) * 1e6,
            "total_mean_us": statistics.mean(total) * 1e6, "total_p90_us": total[int(0.9 * len(total))] * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nv_kvcache.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", action="store_true", help="time schedule+postprocess at batch-N decode")
    p.add_argument("--batch", type=int, nargs="+", default=[256], help="batch sizes for --bench")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=96)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=500)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=25)
    args = p.parse_args(argv)
    if args.bench:
        for batch in args.batch:
            r = bench_decode(batch=batch, block_size=args.block_size, seed=args.seed)
            print(f"decode batch {batch}: schedule {r['schedule_us']:.0f} us + postprocess "
                  f"{r['postprocess_us']:.0f} us = {r['total_us']:.0f} us per step "
                  f"(median; mean {r['total_mean_us']:.0f} us, p90 {r['total_p90_us']:.0f} us)")
        return 0
    return run_workload(args)


if __name__ == "__main__":
    raise SystemExit(main())
