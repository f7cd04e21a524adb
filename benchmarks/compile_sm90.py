"""Compile the FP4 GEMM kernel for sm_90 on a machine without a GPU and report its main loop.

    python benchmarks/compile_sm90.py 16,64,128,4,4            # BLOCK_M,BLOCK_N,BLOCK_K,warps,stages
    PYTHONPATH=/path/to/triton-3.6 python benchmarks/compile_sm90.py ...   # the H200's Triton version

Triton's wheel carries ptxas and cuobjdump, so registers, spills, shared memory, which loads are
pipelined (LDGSTS) and the SASS instructions per weight element of the K loop can be read before spending
device time (how the byte-wide scale loads that stalled every K step were found and fixed).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_rl.kernels.fp4_gemm import _fp4_gemm_kernel  # noqa: E402

SIGNATURE = dict(x_ptr="*bf16", w_ptr="*i32", ws_ptr="*i32", out_ptr="*bf16", row_scale_ptr="*fp32",
                 bias_ptr="*fp32", w_global_ptr="*fp32", M="i32", N="i32", K="i32", stride_xm="i32",
                 stride_wn="i32", stride_wsn="i32", stride_om="i32")
DIVISIBLE = [k for k, v in SIGNATURE.items() if v.startswith("*")] + ["N", "K", "stride_xm", "stride_wn",
                                                                      "stride_wsn", "stride_om"]


def compile_sm90(fn, signature, constexprs, divisible, num_warps, num_stages):
    sig = {**signature, **{k: "constexpr" for k in constexprs}}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in divisible}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    return sass, usage.strip().splitlines()[-1]


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body (the K loop)."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best = (0, 0, -1)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+0x([0-9a-f]+)\s*;", ln)
        if m and int(m.group(1), 16) < addr[i]:
            n = sum(1 for a in addr if int(m.group(1), 16) <= a <= addr[i])
            best = max(best, (n, int(m.group(1), 16), addr[i]))
    return [ln for ln, a in zip(lines, addr) if best[1] <= a <= best[2]]


def main() -> None:
    for arg in sys.argv[1:] or ["16,64,128,4,4"]:
        bm, bn, bk, warps, stages = (int(v) for v in arg.split(","))
        for e8m0 in (False, True):
            consts = dict(SCALE_E8M0=e8m0, HAS_GLOBAL=not e8m0, HAS_ROW_SCALE=False, HAS_BIAS=False, SPLIT_K=1,
                          BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DECODE=1, DOT_F32=False, SCALE_WORDS=True)
            sass, usage = compile_sm90(_fp4_gemm_kernel, SIGNATURE, consts, DIVISIBLE, warps, stages)
            body = loop_body(sass)
            opcode = r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)"
            ops = collections.Counter(re.findall(opcode, "\n".join(body)))
            per_thread = bn * bk / (warps * 32)
            print(f"{'mxfp4' if e8m0 else 'nvfp4'} {arg} (Triton {triton.__version__}): {usage}")
            print(f"  K loop: {len(body)} instructions/thread, {len(body) / per_thread:.2f} per weight element; "
                  f"loads {dict((o, c) for o, c in ops.items() if o.startswith(('LDG', 'LDS')))}")
            print(f"  most frequent: {dict(ops.most_common(8))}")


if __name__ == "__main__":
    main()
