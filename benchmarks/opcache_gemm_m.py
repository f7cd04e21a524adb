"""What the operand cache's GEMMs cost at the fixed workload's batch sizes (issue 16): Qwen3-8B's four dense GEMMs of a
decoder layer (q/k/v stacked 6144x4096, gate/up stacked 24576x4096, o_proj 4096x4096, down 4096x12288) at M rows,
timed as medians of CUDA-graph replays (`engine.timing.graph_median_us`, two weight copies per call list) in one run:

- `bf16_f32`: cuBLAS bf16 x bf16 -> float32, what the operand cache runs today (`fp4_dequant.accumulate`; its FP4
  epilogue, a separate launch, is not included);
- `bf16_bf16`: the same GEMM writing bf16 (what a bf16 model runs: does the float32 output cost?);
- `fp8_f32`: `torch._scaled_mm` e4m3 x e4m3 -> float32, unit scales, `use_fast_accum=False` (an exact FP8 operand
  cache for mxfp4 would run this, then the same epilogue);
- `fp8_row_bf16`: e4m3 with row-wise scales (float32 [M, 1] x [1, N]) -> bf16 in one launch (mxfp4's power-of-two
  factors folded into the scales: the epilogue fused), `use_fast_accum=False`;
- `fp8_row_bf16_fast`: the same with fast accumulation (not exact-sum on Hopper: reported, not proposed).

Per M: per-layer microseconds (one call of each shape), x36 layers, TFLOP/s. Where the M-tile quantization bites
(M = 313 is 2.4 x 128) shows as per-row cost against M = 256 / 384.
Usage: python benchmarks/opcache_gemm_m.py --out OUT.json [--m 256,313,320,350,384,512]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from trace_rl.engine.timing import graph_median_us

SHAPES = {"qkv": (6144, 4096), "gate_up": (24576, 4096), "o_proj": (4096, 4096), "down": (4096, 12288)}
LAYERS = 36


def _variants(m: int, n: int, k: int, dev) -> dict:
    xs = [torch.randn(m, k, device=dev).to(torch.bfloat16) for _ in range(2)]
    ws = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16) for _ in range(2)]
    x8 = [x.clamp(-400, 400).to(torch.float8_e4m3fn) for x in xs]
    w8 = [(w * 50).to(torch.float8_e4m3fn) for w in ws]
    one = torch.ones((), device=dev)
    sa = torch.full((m, 1), 0.5, device=dev)
    sb = torch.full((1, n), 0.25, device=dev)
    return {
        "bf16_f32": [lambda x=x, w=w: torch.mm(x, w.t(), out_dtype=torch.float32) for x, w in zip(xs, ws)],
        "bf16_bf16": [lambda x=x, w=w: torch.mm(x, w.t()) for x, w in zip(xs, ws)],
        "fp8_f32": [lambda a=a, b=b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                                      use_fast_accum=False) for a, b in zip(x8, w8)],
        "fp8_row_bf16": [lambda a=a, b=b: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                           use_fast_accum=False) for a, b in zip(x8, w8)],
        "fp8_row_bf16_fast": [lambda a=a, b=b: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                                                out_dtype=torch.bfloat16, use_fast_accum=True)
                              for a, b in zip(x8, w8)],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="256,313,320,350,384,512")
    ap.add_argument("--budget-s", type=float, default=100.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        if time.time() - t0 > args.budget_s:
            break
        per = {}
        for name, (n, k) in SHAPES.items():
            for var, calls in _variants(m, n, k, dev).items():
                try:
                    us = graph_median_us(calls * 4, reps=10)
                except Exception as e:      # a variant torch does not run here: say which and why
                    per.setdefault(var, {})[name] = f"error: {type(e).__name__}: {str(e)[:160]}"
                    continue
                per.setdefault(var, {})[name] = round(us, 2)
            torch.cuda.empty_cache()
        row = {"M": m, "us": per}
        flops = sum(2 * m * n * k for n, k in SHAPES.values())
        row["layer_us"] = {v: round(sum(d.values()), 2) for v, d in per.items()
                           if all(isinstance(t, float) for t in d.values())}
        row["step_ms_36"] = {v: round(t * LAYERS / 1e3, 3) for v, t in row["layer_us"].items()}
        row["tflops"] = {v: round(flops / (t * 1e-6) / 1e12, 1) for v, t in row["layer_us"].items()}
        row["us_per_row"] = {v: round(t / m, 4) for v, t in row["layer_us"].items()}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("M", "layer_us", "tflops")}), flush=True)
    json.dump({"shapes": SHAPES, "rows": rows, "device": torch.cuda.get_device_name()}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
