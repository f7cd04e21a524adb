"""Probe of the TMA rule behind the 256-token GEMM's illegal instruction (docs/kernels.md, fp4_gemm_wide256.scale_box):
one Gluon kernel TMA-loads the [128, 4] int32 box (the GEMM's scale box) at innermost word `col` of a [128, 64] int32
tensor and stores it; `col` = 4 (16-byte aligned) must copy exactly, `col` = 2 (8 bytes: the first version's nvfp4
step 1) or 1 (mxfp4) is expected to fault with "an illegal instruction". Run each column in its OWN process (a CUDA
error is sticky):

    python benchmarks/tma_alignment_probe.py COL --out tma_probe_COL.json

The JSON: {"col", "ok" (ran and copied exactly), "error"}. Needs an sm_90 GPU and Triton 3.6.
"""

from __future__ import annotations

import argparse
import json
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

ROWS, WORDS, BOX = 128, 64, 4


def box_layout():
    """The GEMM's scale-box shared layout (fp4_gemm_wide256.shared_layouts' second)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def _box_copy_kernel(desc, out_ptr, col):
    """out [ROWS, BOX] = the box of `desc` at (0, col), through shared memory by one TMA load."""
    smem = gl.allocate_shared_memory(gl.int32, desc.block_type.shape, desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [0, col], bar, smem)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    L: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [gl.num_warps(), 1], [1, 0])
    v = smem.load(L)
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, L))
    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, L))
    gl.store(out_ptr + gl.expand_dims(rows, 1) * 4 + gl.expand_dims(cols, 0), v)


def probe(col: int) -> dict:
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    res = {"col": col, "innermost_bytes": 4 * col, "ok": False}
    src = torch.arange(ROWS * WORDS, dtype=torch.int32, device="cuda").view(ROWS, WORDS)
    out = torch.zeros(ROWS, BOX, dtype=torch.int32, device="cuda")
    desc = TensorDescriptor(src, [ROWS, WORDS], [WORDS, 1], [ROWS, BOX], box_layout())
    torch.cuda.synchronize()
    try:
        _box_copy_kernel[(1, )](desc, out, col, num_warps=4)
        torch.cuda.synchronize()
    except Exception as e:   # noqa: BLE001 -- the expected outcome at an unaligned column
        res["error"] = f"{type(e).__name__}: {e}"[:300]
        return res
    res["ok"] = bool(torch.equal(out, src[:, col:col + BOX]))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("col", type=int)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        res = probe(args.col)
    except Exception as e:   # noqa: BLE001
        res = {"col": args.col, "ok": False, "error": f"setup: {type(e).__name__}: {e}"[:300]}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res), flush=True)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
