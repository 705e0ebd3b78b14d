"""Compile one of nv's Triton kernels for a Hopper GPU (sm_90) on any machine, GPU or not, as a launch would
compile it, and report what the machine code costs: registers per thread, stack (where registers spill), shared
memory, the instructions of the whole kernel and of each loop of 40 instructions or more (in program order: the
decode's first loop reads whole KV tiles, its second the one partial tile) with its instruction mix. Triton's
NVIDIA backend brings the ptxas and nvdisasm it runs. Where a kernel is bound by instruction issue, a loop's count
per element is the figure to cut; where it is bound by memory, the registers say how many programs an SM keeps in
flight, and a stack means spills.

    python3 scripts/dev/kernel_sass.py int4-gemv [--rows 1] [--gemv] [--block-n N] [--num-warps W] [--num-stages S]
                                                 [--sass FILE]
    python3 scripts/dev/kernel_sass.py decode [--fp8] [--tile 128] [--group-pad 8] [--num-warps 4] [--num-stages 2]
                                              [--sass FILE]

int4-gemv: nv_kernels.int4_gemm_kernel at Qwen3-8B's qkv with bf16 activations, launched as int4_gemm launches it
for --rows rows (one: the pairs launch, split K; --gemv: the launch for fp32 x, the GEMV on the CUDA cores); per
element: the loop's instructions per thread over the codes a thread handles per group of 128 inputs.
decode: nv_kernels.triton_decode's split kernel at Qwen3-0.6B's heads (16 q, 8 KV, D 128, block size 64, one
split), bf16 or FP8 (e4m3, token-major V) cache; per element: the loop's instructions per thread over the KV
tokens of a tile.
--sass FILE also writes the disassembly. Run with every package's src dir on PYTHONPATH and Triton's interpreter
off. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
MIN_LOOP = 40      # instructions: shorter loops (a split-K reduction, a spin) are left out of the report
LABEL = re.compile(r"^(\.L_x_\d+):")
BACK_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


@dataclass
class SassReport:
    """What one compiled kernel's SASS says (see the module docstring)."""

    kernel: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    instructions: int
    loops: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, kernel: str, cubin: bytes, shared_bytes: int, elements_per_loop: int,
           sass_file: str | None = None) -> SassReport:
        tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                                  check=True).stdout
            usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                                   check=True).stdout
        if sass_file is not None:
            Path(sass_file).write_text(sass)
        registers = int(re.search(r"REG:(\d+)", usage).group(1))            # type: ignore[union-attr]
        stack_bytes = int(re.search(r"STACK:(\d+)", usage).group(1))        # type: ignore[union-attr]
        lines = sass.splitlines()
        opcodes = [m.group(1) if (m := INSTRUCTION.match(line)) else None for line in lines]
        loops = [{"instructions": len(body), "per_element": round(len(body) / elements_per_loop, 2),
                  "mix": dict(collections.Counter(body).most_common(12))}
                 for body in cls._loops(lines, opcodes) if len(body) >= MIN_LOOP]
        return cls(kernel, registers, stack_bytes, shared_bytes, sum(op is not None for op in opcodes), loops)

    @staticmethod
    def _loops(lines: list[str], opcodes: list[str | None]) -> list[list[str]]:
        """Each loop's opcodes (from a label to the last branch back to it), in program order."""
        labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
        ends: dict[str, int] = {}
        for i, line in enumerate(lines):
            m = BACK_BRANCH.search(line)
            if m and m.group(1) in labels and labels[m.group(1)] < i:
                ends[m.group(1)] = i
        return [[op for op in opcodes[labels[label]:end + 1] if op is not None]
                for label, end in sorted(ends.items(), key=lambda item: labels[item[0]])]


def compile_for_hopper(kernel, pointers: dict[str, str], scalars: Mapping[str, int | float], constexprs: dict,
                       num_warps: int, num_stages: int) -> tuple[bytes, int]:
    """The @triton.jit kernel compiled for sm_90 (no GPU needed) as a launch with these arguments compiles it:
    pointers (name -> Triton pointer type) 16-byte aligned, as torch allocates them; scalars (name -> value; int
    or float) specialized as the launcher does unless the kernel says do_not_specialize (an int equal to 1 becomes
    a constant, one divisible by 16 is marked so); constexprs as given. Returns (cubin bytes, shared memory bytes)."""
    signature: dict[str, str] = {}
    constants = dict(constexprs)
    attrs: dict[tuple[int, ...], list] = {}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(scalars[name], float):
            signature[name] = "fp32"
        elif scalars[name] == 1 and name not in kernel.do_not_specialize:
            signature[name] = "constexpr"                  # the launcher makes an int equal to 1 a constant
            constants[name] = 1
        else:
            signature[name] = "i32"
            if scalars[name] % 16 == 0 and name not in kernel.do_not_specialize:
                attrs[(index,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs),
                              target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.asm["cubin"], compiled.metadata.shared


def int4_gemv(args: argparse.Namespace) -> SassReport:
    from nv_kernels.int4_gemm import choose_config
    from nv_kernels.int4_gemm_kernel import int4_gemm_kernel

    pointers = {"X": "*bf16", "QW": "*i32", "SCALES": "*bf16", "ZEROS": "*u8", "BIAS": "*bf16", "OUT": "*bf16",
                "PART": "*fp32", "COUNTERS": "*i32"}
    n, k = 6144, 4096                                   # Qwen3-8B's qkv projection
    cfg = choose_config(args.rows, n, k, 132, pairs=not args.gemv)
    cfg = cfg._replace(block_n=args.block_n or cfg.block_n, num_warps=args.num_warps or cfg.num_warps,
                       num_stages=args.num_stages or cfg.num_stages)
    groups_per_split = -(-k // 128 // cfg.split_k)
    scalars = {"M": args.rows, "N": n, "K": k, "GROUPS_PER_SPLIT": groups_per_split, "SPLIT_K": cfg.split_k,
               "stride_xm": k, "stride_qn": k // 8, "stride_sg": n, "stride_om": n, "stride_ps": n}
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "USE_DOT": cfg.use_dot, "SPLIT": cfg.split_k > 1,
                  "GATED": False, "HAS_BIAS": False, "DOT_IN_FP32": False, "NUM_STAGES": cfg.num_stages,
                  "USE_PDL": False, "PAIRS": cfg.pairs}
    cubin, shared = compile_for_hopper(int4_gemm_kernel, pointers, scalars, constexprs, cfg.num_warps,
                                       cfg.num_stages)
    # a group is 128 inputs of BLOCK_N rows, spread over the program's threads
    return SassReport.of("int4-gemv", cubin, shared, cfg.block_n * 128 // (32 * cfg.num_warps), args.sass)


def decode(args: argparse.Namespace) -> SassReport:
    import triton.language as tl

    from nv_kernels.triton_decode import _decode_split_kernel

    cache = "*fp8e4nv" if args.fp8 else "*bf16"
    pointers = {"Q": "*bf16", "K": cache, "V": cache, "BLOCK_TABLES": "*i32", "SEQ_LENS": "*i32", "OUT": "*bf16",
                "PART_O": "*fp32", "PART_LSE": "*fp32", "COUNTERS": "*i32", "K_SCALE": "*fp32", "V_SCALE": "*fp32",
                "K_NEW": "*bf16", "V_NEW": "*bf16", "POS": "*i64", "SLOTS": "*i64", "COS_SIN": "*fp32",
                "QW": "*bf16", "KW": "*bf16"}
    # the caches [blocks, 64, 8, 128]; an FP8 V token-major (nv_kernels.kv_layout): strides (65536, 1, 8192, 64)
    v_strides = (65536, 1, 8192, 64) if args.fp8 else (65536, 1024, 128, 1)
    scalars = {"qk_scale": 0.1275, "stride_qb": 2048, "stride_qh": 128, "stride_cb": 65536, "stride_cs": 1024,
               "stride_ch": 128, "stride_vb": v_strides[0], "stride_vs": v_strides[1], "stride_vh": v_strides[2],
               "stride_vd": v_strides[3], "stride_tb": 65, "stride_ob": 2048, "stride_oh": 128, "stride_ksh": 128,
               "stride_ksd": 1, "stride_vsh": 128, "stride_vsd": 1, "eps": 0.0, "stride_knb": 0, "stride_knh": 0,
               "stride_vnb": 0, "stride_vnh": 0, "stride_cos": 0}
    constexprs = {"GROUP": 2, "GROUP_PAD": args.group_pad, "HEAD_DIM": 128, "D_PAD": 128, "BLOCK_SIZE": 64,
                  "TILE": args.tile, "NUM_SPLITS": 1, "NUM_Q_HEADS": 16, "PRECISION": "tf32", "FP8": args.fp8,
                  "COMPUTE": tl.float16 if args.fp8 else tl.bfloat16, "V_TOKEN_MAJOR": args.fp8, "USE_PDL": False,
                  "ROPE": False, "HAS_NORM": False, "HALF": 64, "FP8_MAX": 448.0 if args.fp8 else 0.0,
                  "PRELOAD": False}
    cubin, shared = compile_for_hopper(_decode_split_kernel, pointers, scalars, constexprs, args.num_warps,
                                       args.num_stages)
    return SassReport.of("decode-fp8" if args.fp8 else "decode-bf16", cubin, shared, args.tile, args.sass)


KERNELS: dict[str, Callable[[argparse.Namespace], SassReport]] = {"int4-gemv": int4_gemv, "decode": decode}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", choices=sorted(KERNELS))
    parser.add_argument("--num-warps", type=int, default=None, help="default: the launch's (int4-gemv), 4 (decode)")
    parser.add_argument("--num-stages", type=int, default=None, help="default: the launch's (int4-gemv), 2 (decode)")
    parser.add_argument("--block-n", type=int, default=None,
                        help="int4-gemv: output columns per program (default: the launch's)")
    parser.add_argument("--rows", type=int, default=1, help="int4-gemv: rows of x")
    parser.add_argument("--gemv", action="store_true",
                        help="int4-gemv: the launch for fp32 x (one row: the GEMV on the CUDA cores), not the pairs")
    parser.add_argument("--tile", type=int, default=None, help="decode: KV tokens per tile (default: 128 FP8, 64)")
    parser.add_argument("--fp8", action="store_true", help="decode: an FP8 (e4m3) cache")
    parser.add_argument("--group-pad", type=int, default=None,
                        help="decode: rows of a program's query tile (2 query heads, padded; default: the engine's)")
    parser.add_argument("--sass", help="also write the disassembly to this file")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.kernel == "decode":
        args.num_warps = args.num_warps or 4
        args.num_stages = args.num_stages or 2
    if args.tile is None:
        args.tile = 128 if args.fp8 else 64
    if args.group_pad is None:
        from nv_kernels.decode_tuning import query_tile_rows

        args.group_pad = query_tile_rows(2, args.fp8)
    print(json.dumps(KERNELS[args.kernel](args).__dict__))


if __name__ == "__main__":
    main()
