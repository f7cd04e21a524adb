"""Compile kernels for sm_90 on a machine without a GPU and report their main loop (a CLI over
trace_rl/kernels/sass_gate.py, which holds the logic and the shipped cases).

    python benchmarks/compile_sm90.py                          # the gate: every shipped case
    python benchmarks/compile_sm90.py 16,256,128,4,4 64,128,128,8,3   # GEMM tiles BM,BN,BK,warps,stages
    PYTHONPATH=/work/triton36 python benchmarks/compile_sm90.py ...   # the H200's Triton 3.6
    python benchmarks/compile_sm90.py attn:bf16:16             # decode attention FMT[:PAGE], split launches

For each GEMM tile it prints registers, SASS per weight element of the K loop, the opcode counts, and the gate's
verdict (decoded tile kept in registers, HGMMA with a register A operand, no serialised wgmma, no spills in
the loop), for nvfp4 and mxfp4. For `attn:FMT[:PAGE]` (Qwen3-8B heads, the format's shipped tile,
attention_config.TILES) it compiles the decode-attention kernel with one split and with split partials, and the
fixed-order merge for 2-4 splits (the engine's timed split counts), printing each one's registers and CTAs per SM.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_rl.kernels import sass_gate  # noqa: E402


def main() -> int:
    if len(sys.argv) == 1:
        return sass_gate.main(["--verbose"])
    from trace_rl.kernels.fp4_gemm import GemmConfig, gemm_gate_case

    if sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    status = 0
    for arg in sys.argv[1:]:
        if arg.startswith("attn:"):
            status |= attention_launches(*arg.split(":")[1:])
            continue
        bm, bn, bk, warps, stages = (int(v) for v in arg.split(","))
        for fmt in ("nvfp4", "mxfp4"):
            case = gemm_gate_case(GemmConfig(bm, bn, bk, 1, warps, stages), fmt)
            r = sass_gate.inspect(case, *sass_gate.compile_sass(case))
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.name}: {r.per_element:.2f} SASS/elem, {r.registers} regs, "
                  f"{r.spills} B spilled (Triton {r.triton}) {'; '.join(r.violations)}")
            print("     ", dict(list(r.opcodes.items())[:14]))
            status |= not r.ok
    return status


def attention_launches(fmt: str, page: str = "64") -> int:
    """Compile what a decode-attention launch over `fmt` can run for sm_90: the kernel (one split: output written
    directly; several: float32 partials) and the merge of 2-4 splits. Returns 1 if one fails to compile."""
    import traceback

    from trace_rl.kernels.attention_config import REGISTERS_PER_SM, TILES, TIMED_SPLITS
    from trace_rl.kernels.attention_sass import attention_loop, compile_sass
    from trace_rl.kernels.paged_attention import _merge_splits_kernel

    cfg, status = TILES[fmt], 0

    def ctas(regs: int, warps: int) -> int:
        return REGISTERS_PER_SM // (32 * warps * max(regs, 1))

    for split in (False, True):
        try:
            r = attention_loop(fmt, page=int(page), split=split)
            regs = int(r.registers.split("REG:")[1].split()[0]) if "REG:" in r.registers else 0
            print(f"ok   attention {fmt} page {page} tile {cfg.block_t}x{cfg.num_warps}w{cfg.num_stages}s "
                  f"{'split partials' if split else 'one split     '}: {r.instructions} instr/loop, "
                  f"{r.per_element:.2f} SASS/elem, {regs} regs ({ctas(regs, cfg.num_warps)} CTAs/SM; "
                  f"config says {cfg.registers})")
        except Exception:
            print(f"FAIL attention {fmt} split={split}\n{traceback.format_exc()[-2000:]}")
            status = 1
    for splits in (s for s in TIMED_SPLITS if s > 1):
        consts = dict(HQ=32, HEAD_DIM=128, SPLITS=splits, SPLITS_PAD=1 << (splits - 1).bit_length())
        sig = dict(part_ptr="*fp32", ml_ptr="*fp32", out_ptr="*bf16", stride_ob="i32", stride_oh="i32")
        try:
            _, usage = compile_sass(_merge_splits_kernel, sig, consts, ["part_ptr", "ml_ptr", "out_ptr"], 4, 3)
            print(f"ok   merge of {splits} splits: {usage}")
        except Exception:
            print(f"FAIL merge of {splits} splits\n{traceback.format_exc()[-2000:]}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
