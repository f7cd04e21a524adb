"""Compile kernels for sm_90 on a machine without a GPU and report their main loop (a CLI over
trace_rl/kernels/sass_gate.py, which holds the logic and the shipped cases).

    python benchmarks/compile_sm90.py                          # the gate: every shipped case
    python benchmarks/compile_sm90.py 16,256,128,4,4 64,128,128,8,3   # GEMM tiles BM,BN,BK,warps,stages
    PYTHONPATH=/work/triton36 python benchmarks/compile_sm90.py ...   # the H200's Triton 3.6

For each GEMM tile it prints registers, SASS per weight element of the K loop, the opcode counts, and the gate's
verdict (decoded tile kept in registers, HGMMA with a register A operand, no serialised wgmma, no spills in
the loop), for nvfp4 and mxfp4.
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

    status = 0
    for arg in sys.argv[1:]:
        bm, bn, bk, warps, stages = (int(v) for v in arg.split(","))
        for fmt in ("nvfp4", "mxfp4"):
            case = gemm_gate_case(GemmConfig(bm, bn, bk, 1, warps, stages), fmt)
            r = sass_gate.inspect(case, *sass_gate.compile_sass(case))
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.name}: {r.per_element:.2f} SASS/elem, {r.registers} regs, "
                  f"{r.spills} B spilled (Triton {r.triton}) {'; '.join(r.violations)}")
            print("     ", dict(list(r.opcodes.items())[:14]))
            status |= not r.ok
    return status


if __name__ == "__main__":
    sys.exit(main())
