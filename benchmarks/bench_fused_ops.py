"""Torch path vs fused Triton path for the elementwise work around the GEMMs and attention (GPU only).

Part 1 -- one decoder layer's elementwise work at the Qwen3-0.6B shape (bf16, batch 256 decode):
input RMSNorm + residual, q/k RMSNorm + rotary + v copy + KV-cache store, post-attention
RMSNorm + residual, SiLU-and-mul. Each op alone (do_bench median, eager launches), then the whole
sequence x num_layers captured in one CUDA graph (what a decode step pays), per layer and per step.
Part 2 (unless --skip-model) -- the whole Qwen3-0.6B forward (random weights) at batch 256, context
~1024, block size 16, captured in a CUDA graph, fused ops "off" vs "on": ms per forward (do_bench
median of graph replays) and CUDA kernels per forward (torch.profiler over one eager forward).

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/bench_fused_ops.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from triton.testing import do_bench

from nv_kernels import fused_ops, get_backend
from nv_kernels.fused_act import silu_and_mul_triton
from nv_kernels.fused_norm import rms_norm_triton
from nv_kernels.fused_rope import qk_norm_rope_triton
from nv_kernels.triton_store import store_kvcache
from nv_layers import ForwardContext, RMSNorm, SiluAndMul, forward_context, get_rope

H, HQ, HKV, D, INTER, LAYERS, EPS = 1024, 16, 8, 128, 3072, 28, 1e-6    # Qwen3-0.6B
DTYPE, BLOCK_SIZE = torch.bfloat16, 16


def median_ms(fn: Callable[[], object], rep: int = 200) -> float:
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def graph_ms(fn: Callable[[], object], repeats: int) -> float:
    """fn() x repeats captured in one CUDA graph; median ms per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()                                                  # compile / warm up off the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return median_ms(graph.replay)


def layer_inputs(batch: int, context: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    blocks_per_seq = -(-(context + 1) // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    slots = torch.arange(batch, device="cuda") * blocks_per_seq * BLOCK_SIZE + context   # one new token each

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).to(DTYPE)

    return dict(hidden=rand(batch, H), residual=rand(batch, H), attn_out=rand(batch, H),
                qkv=rand(batch, (HQ + 2 * HKV) * D), gate_up=rand(batch, 2 * INTER),
                positions=torch.full((batch,), context, device="cuda", dtype=torch.int64),
                slots=slots, k_cache=torch.zeros(num_blocks, BLOCK_SIZE, HKV, D, device="cuda", dtype=DTYPE),
                v_cache=torch.zeros(num_blocks, BLOCK_SIZE, HKV, D, device="cuda", dtype=DTYPE))


def layer_ops(inp: dict) -> dict[str, dict[str, Callable[[], object]]]:
    """{op: {"torch": fn, "fused": fn}} for one layer's elementwise work."""
    with torch.device("cuda"):
        norm, q_norm, k_norm = RMSNorm(H, EPS).to(DTYPE), RMSNorm(D, EPS).to(DTYPE), RMSNorm(D, EPS).to(DTYPE)
        rope = get_rope(D, D, 40960, 1e6)
    act = SiluAndMul()
    qkv, kc, vc = inp["qkv"], inp["k_cache"], inp["v_cache"]
    batch = qkv.shape[0]

    def torch_norm_rope_store() -> None:
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
        q, k = q_norm(q.reshape(batch, HQ, D)), k_norm(k.reshape(batch, HKV, D))
        q, k = rope(inp["positions"], q, k)
        store_kvcache(k, v.contiguous().view(batch, HKV, D), kc, vc, inp["slots"])

    def fused_norm_rope_store() -> None:
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
        qk_norm_rope_triton(q, k, v, inp["positions"], rope.cos_sin_cache, head_dim=D, rotary_dim=D,
                            q_weight=q_norm.weight, k_weight=k_norm.weight, eps=EPS, k_cache=kc, v_cache=vc,
                            slot_mapping=inp["slots"])

    return {
        "add+rmsnorm (input)": {"torch": lambda: norm(inp["hidden"], inp["residual"]),
                                "fused": lambda: rms_norm_triton(inp["hidden"], norm.weight, EPS, inp["residual"])},
        "qk-norm+rope+v+store": {"torch": torch_norm_rope_store, "fused": fused_norm_rope_store},
        "add+rmsnorm (post-attn)": {"torch": lambda: norm(inp["attn_out"], inp["residual"]),
                                    "fused": lambda: rms_norm_triton(inp["attn_out"], norm.weight, EPS,
                                                                     inp["residual"])},
        "silu-and-mul": {"torch": lambda: act(inp["gate_up"]), "fused": lambda: silu_and_mul_triton(inp["gate_up"])},
    }


def bench_layer(batch: int, context: int, results: dict) -> None:
    inp = layer_inputs(batch, context)
    ops = layer_ops(inp)
    with fused_ops("off"):                    # the nv_layers modules take the torch path
        print(f"\n== one layer's elementwise work, batch {batch}, bf16 (do_bench medians, us) ==")
        print(f"{'op':28s} {'torch':>9s} {'fused':>9s}")
        rows = {}
        for name, fns in ops.items():
            t, f = median_ms(fns["torch"]) * 1e3, median_ms(fns["fused"]) * 1e3
            rows[name] = {"torch_us": t, "fused_us": f}
            print(f"{name:28s} {t:9.2f} {f:9.2f}")
        whole = {}
        for path in ("torch", "fused"):
            seq = [fns[path] for fns in ops.values()]
            whole[path] = graph_ms(lambda seq=seq: [fn() for fn in seq], LAYERS) * 1e3   # us per step
    saving = whole["torch"] - whole["fused"]
    print(f"CUDA graph, {LAYERS} layers: torch {whole['torch']:.1f} us/step ({whole['torch'] / LAYERS:.2f}/layer), "
          f"fused {whole['fused']:.1f} us/step ({whole['fused'] / LAYERS:.2f}/layer), saving {saving:.1f} us/step")
    results[f"layer_b{batch}"] = {"ops": rows, "graph_us_per_step": whole, "saving_us_per_step": saving}


def build_model():
    from nv_engine.model_loader.random_model import qwen3_config
    from nv_qwen3 import Qwen3ForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(qwen3_config("qwen3-0.6b"))
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


def bench_model(batch: int, context: int, results: dict) -> None:
    model = build_model()
    blocks_per_seq = -(-(context + 1) // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    for layer in model.model.layers:
        kv = torch.zeros(2, num_blocks, BLOCK_SIZE, HKV, D, device="cuda", dtype=DTYPE)
        layer.self_attn.attn.k_cache, layer.self_attn.attn.v_cache = kv[0], kv[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    tables = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32).view(batch, blocks_per_seq)
    slots = tables[:, context // BLOCK_SIZE].long() * BLOCK_SIZE + context % BLOCK_SIZE
    ctx = ForwardContext(is_decode=True, slot_mapping=slots,
                         seq_lens=torch.full((batch,), context + 1, dtype=torch.int32, device="cuda"),
                         block_tables=tables, cu_seqlens_q=None, max_seqlen_q=1, max_seqlen_k=4096,
                         logits_indices=None, backend=get_backend(None, "cuda"))
    ids = torch.randint(0, 151936, (batch,), device="cuda", generator=g)
    positions = torch.full((batch,), context, dtype=torch.int64, device="cuda")
    print(f"\n== Qwen3-0.6B forward, batch {batch}, context {context + 1}, backend {ctx.backend.name} ==")
    out = {}
    with torch.inference_mode(), forward_context(ctx):
        for mode in ("off", "on"):
            with fused_ops(mode if mode == "off" else "auto"):
                ms = graph_ms(lambda: model(ids, positions), 1)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    model(ids, positions)
                    torch.cuda.synchronize()
                kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            out[mode] = {"graph_ms": ms, "kernels": len(kernels), "kernels_per_layer": len(kernels) / LAYERS}
            print(f"fused ops {mode:3s}: {ms:.3f} ms/forward (CUDA graph), {len(kernels)} kernels "
                  f"({len(kernels) / LAYERS:.1f} per layer)")
    saving = out["off"]["graph_ms"] - out["on"]["graph_ms"]
    print(f"saving {saving:.3f} ms/forward ({100 * saving / out['off']['graph_ms']:.1f}%)")
    results[f"model_b{batch}"] = {**out, "saving_ms": saving}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 32, 1])
    p.add_argument("--context", type=int, default=1023)
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fused_ops.py needs a CUDA GPU")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    results: dict = {}
    for batch in args.batch:
        bench_layer(batch, args.context, results)
    if not args.skip_model:
        for batch in args.batch:
            bench_model(batch, args.context, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
