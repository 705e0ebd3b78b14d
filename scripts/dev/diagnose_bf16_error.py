"""Where does our bf16 error against HF come from? One GPU run, two parts.

A. Attention kernels alone: our Triton decode / prefill against torch's bf16 SDPA on the same bf16
   inputs, both against a float64 reference (Qwen3-0.6B heads: Hq 16, Hkv 8, D 128; contexts up to
   1,100). A ratio near 1 means the kernels are as precise as torch's flash attention.
B. The whole Qwen3-0.6B-shape model (random weights, as tests/test_model_vs_hf.py's GPU test):
   relative error of the logits against HF's fp32 forward, for HF bf16 and for our model under
   variants that switch one suspect off at a time: the attention backend (torch = fp32 attention),
   the fused norm/rope/activation kernels, cuBLAS's reduced-precision bf16 split-K reductions.
   Rows are split into the prefill row and the decode rows (decode GEMMs have M = 5: split-K).

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' ':') python3 scripts/dev/diagnose_bf16_error.py
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from nv_engine.model_loader.random_model import SHAPES
from nv_kernels import get_backend
from nv_kernels.fused_dispatch import fused_ops
from nv_kernels.testing import dense_causal_attention, random_paged_batch
from nv_kernels.triton_decode import decode_attention
from nv_kernels.triton_prefill import prefill_attention
from nv_layers.loader import build_model
from nv_layers.testing import PagedDriver
from nv_qwen3 import get_model_class

HQ, HKV, D = 16, 8, 128
SCALE = D ** -0.5


def sdpa_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [Q, Hq, D] at the last Q positions of k/v [L, Hkv, D] -> [Q, Hq, D] (torch's bf16 SDPA)."""
    nq, length = q.shape[0], k.shape[0]
    qh = q.transpose(0, 1)[None]
    kh = k.transpose(0, 1)[None].repeat_interleave(HQ // HKV, dim=1)
    vh = v.transpose(0, 1)[None].repeat_interleave(HQ // HKV, dim=1)
    if nq == length:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=SCALE)
    else:
        mask = torch.arange(length, device=q.device)[None, :] <= torch.arange(
            length - nq, length, device=q.device)[:, None]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=SCALE)
    return out[0].transpose(0, 1)


def kernel_part() -> None:
    print("== A. attention kernels vs torch bf16 SDPA (relative error vs float64) ==")
    cases = [("decode", [17, 300, 700, 1100], [1, 1, 1, 1]),
             ("prefill", [300, 40, 1100], [300, 40, 1100]),
             ("prefill", [1100], [200])]
    for q_scale in (1.0, 4.0):
        for kind, seq_lens, q_lens in cases:
            b = random_paged_batch(seq_lens, q_lens, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                   block_size=16, dtype=torch.bfloat16, device="cuda", seed=1)
            q = (b.q.float() * q_scale).to(torch.bfloat16)
            if kind == "decode":
                out = decode_attention(q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables,
                                       max(seq_lens), SCALE)
            else:
                out = prefill_attention(q, b.k_cache, b.v_cache, b.cu_seqlens_q, b.seq_lens,
                                        b.block_tables, max(q_lens), SCALE)
            cu = b.cu_seqlens_q.tolist()
            err_ours = err_torch = norm = 0.0
            for i in range(len(seq_lens)):
                qi = q[cu[i]:cu[i + 1]]
                ref = dense_causal_attention(qi, b.keys[i], b.values[i], SCALE)
                err_ours += float((out[cu[i]:cu[i + 1]].double() - ref).norm() ** 2)
                err_torch += float((sdpa_bf16(qi, b.keys[i], b.values[i]).double() - ref).norm() ** 2)
                norm += float(ref.norm() ** 2)
            ours, theirs = (err_ours / norm) ** 0.5, (err_torch / norm) ** 0.5
            print(f"  {kind:7s} ctx {seq_lens} q {q_lens} q x{q_scale}: ours {ours:.3e}  "
                  f"torch-bf16 {theirs:.3e}  ratio {ours / theirs:.2f}")


def model_part(tmp: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3

    print("== B. whole model: logits relative error vs HF fp32 (all rows / prefill / decode) ==")
    config = Qwen3Config(**SHAPES["qwen3-0.6b"])
    torch.manual_seed(0)
    HFQwen3(config).to(torch.bfloat16).save_pretrained(tmp)
    saved = AutoConfig.from_pretrained(tmp)
    gen = torch.Generator().manual_seed(5)
    lengths, num_decode = [1, 37, 300, 1025], 3
    full = [torch.randint(0, config.vocab_size, (n + num_decode,), generator=gen).tolist() for n in lengths]
    rows = [(i, lengths[i] - 1 + s) for s in range(num_decode + 1) for i in range(len(lengths))]
    is_prefill = torch.tensor([s == 0 for s in range(num_decode + 1) for _ in lengths])

    # dtype through from_pretrained keeps HF's rotary inv_freq in fp32; .to(bf16) would round it and make
    # the fp32 "truth" below share that coarser rope with HF bf16 (this script's first finding, 2026-11-29)
    hf = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=torch.bfloat16).to("cuda").eval()

    def hf_rows() -> torch.Tensor:  # [R, V] fp32
        with torch.no_grad():
            per_seq = [hf(torch.tensor([t], device="cuda")).logits[0].float() for t in full]
        return torch.stack([per_seq[i][pos] for i, pos in rows])

    matmul = torch.backends.cuda.matmul
    reduced = matmul.allow_bf16_reduced_precision_reduction
    hf_bf16 = hf_rows()
    matmul.allow_bf16_reduced_precision_reduction = False
    hf_bf16_no_reduced = hf_rows()
    matmul.allow_bf16_reduced_precision_reduction = reduced
    hf.float()
    truth = hf_rows()
    hf = None  # frees its GPU memory
    torch.cuda.empty_cache()

    def rel(x: torch.Tensor) -> str:
        def r(m: torch.Tensor) -> float:
            return float((x[m] - truth[m]).norm() / truth[m].norm())
        return f"{r(torch.ones_like(is_prefill)):.4f} / {r(is_prefill):.4f} / {r(~is_prefill):.4f}"

    print(f"  {'HF bf16 (sdpa)':<40} {rel(hf_bf16)}")
    print(f"  {'HF bf16, no bf16 split-K reduce':<40} {rel(hf_bf16_no_reduced)}")
    model = build_model(get_model_class(saved), saved, tmp, dtype=torch.bfloat16, device="cuda")

    def ours(backend: str) -> torch.Tensor:
        driver = PagedDriver(model, num_blocks=256, block_size=16, backend=get_backend(backend, "cuda"),
                             dtype=torch.bfloat16, device="cuda")
        for i, tokens in enumerate(full):
            driver.add(i, tokens[:lengths[i]])
        out = [driver.step([(i, lengths[i]) for i in range(len(full))]).float()]
        for s in range(num_decode):
            for i in range(len(full)):
                driver.append(i, full[i][lengths[i] + s])
            out.append(driver.step([(i, 1) for i in range(len(full))]).float())
        return torch.cat(out)  # [R, V], rows in the order of `rows`

    variants = [("ours: triton attention (default)", "triton", "auto", True),
                ("ours: torch attention (fp32 math)", "torch", "auto", True),
                ("ours: triton, fused ops off", "triton", "off", True),
                ("ours: triton, no bf16 split-K reduce", "triton", "auto", False)]
    for name, backend, fused, allow_reduced in variants:
        matmul.allow_bf16_reduced_precision_reduction = allow_reduced
        with fused_ops(fused) if fused != "auto" else contextlib.nullcontext():
            print(f"  {name:<40} {rel(ours(backend))}")
    matmul.allow_bf16_reduced_precision_reduction = reduced


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    kernel_part()
    with tempfile.TemporaryDirectory() as tmp:
        model_part(Path(tmp))


if __name__ == "__main__":
    main()
