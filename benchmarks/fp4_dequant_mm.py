"""Dense FP4 linear at large M on the GPU: dequantize to bf16 + cuBLAS (kernels/fp4_dequant.py) against the FP4
GEMM (`fp4_matmul`, W4A16 and W4A4) and cuBLAS BF16, to place `DEQUANT_CUBLAS_MIN_M`.

    python benchmarks/fp4_dequant_mm.py OUT_DIR [--budget-s 50] [--fmt nvfp4]

Per (N, K) in 2048x4096, 5120x2048 (MoE qkv), 4096x2048, 4096x12288, 12288x4096 and M in 64, 128, 256, 471,
512: CUDA-graph medians
(`bench.measure.graph_median_us`) over weight copies (enough for 200 MB of FP4 bytes, at most 16: >= 67 MB of FP4
and >= 268 MB of bf16 weights per graph, beyond the 50 MB L2, as benchmarks/kernels.py does) of
- `cublas_bf16_us`: torch.mm(x, W^T) in bf16;
- `fp4_w4a16_us`, `fp4_w4a4_us`: fp4_matmul (default config) on bf16 / pre-quantized activations;
- `dq_w4a16_us`, `dq_w4a4_us`: dequant_matmul (dequantize into the shared scratch, cuBLAS float32 output,
  epilogue); `dequant_us` (per shape): the dequantization kernel alone.
And per shape `rel_err_*`: dequant path vs fp4_matmul at M = 471 (bf16 output, relative Frobenius error).
Writes OUT_DIR/fp4_dequant_mm.json after every row; stops starting rows when the budget is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_rl.backends import get_backend  # noqa: E402
from trace_rl.bench.measure import graph_median_us  # noqa: E402
from trace_rl.formats import per_token  # noqa: E402
from trace_rl.kernels.fp4_dequant import DEQUANT_CUBLAS_MIN_M, dequant_matmul, dequantize_to, scratch  # noqa: E402
from trace_rl.kernels.fp4_gemm import fp4_matmul  # noqa: E402
from trace_rl.kernels.linear import hopper_weight  # noqa: E402
from trace_rl.kernels.row_quantize import quantize_dequant_bf16  # noqa: E402

# (N, K): the MoE attention's o_proj and qkv first (the budget may end the run before the 8B shapes)
SHAPES = [(2048, 4096), (5120, 2048), (4096, 2048), (4096, 12288), (12288, 4096)]
MS = [64, 128, 256, 471, 512]


def copies(fp4_bytes: int, target: int = 200 << 20, cap: int = 16) -> int:
    return max(2, min(cap, -(-target // fp4_bytes)))


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=50.0)
    ap.add_argument("--fmt", default="nvfp4", choices=["nvfp4", "mxfp4"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fp4_dequant_mm.json")
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "fmt": args.fmt,
           "threshold_m": DEQUANT_CUBLAS_MIN_M, "rows": [], "shapes": [], "stopped_early": False}
    backend = get_backend("fp4")
    for N, K in SHAPES:
        if time.time() - t0 > args.budget_s:
            res["stopped_early"] = True
            break
        n = copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n)]
        packed = [backend.prepare_weight(w, args.fmt) for w in w_bf16]
        hs = [hopper_weight(p) for p in packed]
        buf = scratch("cuda", N, K)
        shape_row = {"N": N, "K": K, "copies": n,
                     "dequant_us": graph_median_us([lambda p=p, h=h, buf=buf: dequantize_to(p.q, h, buf)
                                                    for p, h in zip(packed, hs)])}
        x = torch.randn(471, K, device="cuda", dtype=torch.bfloat16)
        xq, rs = quantize_dequant_bf16(x, per_token(args.fmt))
        shape_row["rel_err_w4a16"] = rel(dequant_matmul(x, packed[0].q, hs[0]), fp4_matmul(x, hs[0]))
        shape_row["rel_err_w4a4"] = rel(dequant_matmul(xq, packed[0].q, hs[0], rs), fp4_matmul(xq, hs[0], rs))
        res["shapes"].append(shape_row)
        print(json.dumps(shape_row), flush=True)
        for M in MS:
            if time.time() - t0 > args.budget_s:
                res["stopped_early"] = True
                break
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            xq, rs = quantize_dequant_bf16(x, per_token(args.fmt))
            row = {"N": N, "K": K, "M": M, "copies": n}
            row["cublas_bf16_us"] = graph_median_us([lambda w=w, x=x: torch.mm(x, w.t()) for w in w_bf16])
            row["fp4_w4a16_us"] = graph_median_us([lambda h=h, x=x: fp4_matmul(x, h) for h in hs])
            row["fp4_w4a4_us"] = graph_median_us([lambda h=h, xq=xq, rs=rs: fp4_matmul(xq, h, rs) for h in hs])
            row["dq_w4a16_us"] = graph_median_us([lambda p=p, h=h, x=x: dequant_matmul(x, p.q, h)
                                                  for p, h in zip(packed, hs)])
            row["dq_w4a4_us"] = graph_median_us([lambda p=p, h=h, xq=xq, rs=rs: dequant_matmul(xq, p.q, h, rs)
                                                 for p, h in zip(packed, hs)])
            row["dq_vs_fp4_w4a4"] = round(row["fp4_w4a4_us"] / row["dq_w4a4_us"], 3)
            row["dq_vs_cublas"] = round(row["cublas_bf16_us"] / row["dq_w4a4_us"], 3)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
        del w_bf16, packed, hs
        torch.cuda.empty_cache()
    res["elapsed_s"] = round(time.time() - t0, 1)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
