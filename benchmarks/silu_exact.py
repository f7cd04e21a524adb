"""The MLP's SiLU x mul + W4A4 input quantization of the down projection, apart (torch's SiLU, its multiply, the
quantize launch: the rollout's path before issue 16's fusion) against fused (one launch, `quantize_dequant_bf16(gate |
up, silu_mul=True)` with the exact SiLU, `kernels.swiglu.EXACT_SILU`), at the fixed workload's decode batch on the
Qwen3-8B shape (M = 313, intermediate 12288), nvfp4:row. In the same run:
- bits: the fused operand and row scales against apart's (must be identical), the exact and the old fast SiLU x mul
  (`swiglu.silu_mul`) against torch over every bf16 gate (exact: 0 mismatches; fast: how many, for the record);
- timing: each variant as `--calls` calls in one CUDA graph (`engine.timing.graph_median_us`: median per call of
  `--reps` replays after warm-up), hot (one input, L2-resident as the GEMM's output is in the step) and cold
  (inputs cycling through > L2), plus the fast-form fused, the exact fused at 8 warps (the tile without
  `fp4_block_tiles.SILU_MUL_MAX_WARPS`) and the exact `silu_mul` kernel + quantize (two launches).
Each part runs in its own try: a failing one leaves an "error" and the others still run.

    python benchmarks/silu_exact.py --out OUT.json
    DRY=1 python benchmarks/silu_exact.py --out OUT.json      # CPU dry run (interpreter, tiny shapes, wall-clock
                                                             # timing, bits recorded but not checked: the
                                                             # interpreter has no libdevice and truncates to bf16)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

DRY = os.environ.get("DRY") == "1"
DEV = "cpu" if DRY else "cuda"
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def torch_apart(x: torch.Tensor, fmt: str):
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    g, u = x.chunk(2, dim=-1)
    return quantize_dequant_bf16(F.silu(g) * u, fmt)


def fused(x: torch.Tensor, fmt: str):
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    return quantize_dequant_bf16(x, fmt, silu_mul=True)


def fused_8_warps(x: torch.Tensor, fmt: str):
    """`fused` on the tile without `fp4_block_tiles.SILU_MUL_MAX_WARPS` (8 warps: 122 registers at K = 12288)."""
    from trace_rl.kernels import fp4_block_tiles

    old = fp4_block_tiles.SILU_MUL_MAX_WARPS
    fp4_block_tiles.SILU_MUL_MAX_WARPS = 8
    try:
        return fused(x, fmt)
    finally:
        fp4_block_tiles.SILU_MUL_MAX_WARPS = old


def kernel_then_quantize(x: torch.Tensor, fmt: str):
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16
    from trace_rl.kernels.swiglu import silu_mul

    return quantize_dequant_bf16(silu_mul(x), fmt)


def mismatches(a: torch.Tensor, b: torch.Tensor) -> dict:
    dt = torch.int16 if a.element_size() == 2 else torch.int32
    ia, ib = a.view(dt), b.view(dt)
    na, nb = a.isnan(), b.isnan()
    return {"bits": int(((ia != ib) & ~na & ~nb).sum()), "nan_positions": int((na != nb).sum()),
            "nan_payloads": int(((ia != ib) & na & nb).sum()), "elements": a.numel()}


def every_gate(rows: int = 8) -> torch.Tensor:
    g = torch.arange(-32768, 32768, 4096 if DRY else 1, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    u = torch.randint(-32768, 32768, (rows, g.numel()), generator=torch.Generator().manual_seed(0),
                      dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return torch.cat([g.expand(rows, -1), u], dim=1).to(DEV)


def with_silu_form(exact: bool, fn):
    from trace_rl.kernels import swiglu

    old = swiglu.EXACT_SILU
    swiglu.EXACT_SILU = exact
    try:
        return fn()
    finally:
        swiglu.EXACT_SILU = old


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=313)
    ap.add_argument("--inter", type=int, default=12288)
    ap.add_argument("--fmt", default="nvfp4:row")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--layers", type=int, default=36, help="layers per step for the per-step estimate (Qwen3-8B)")
    args = ap.parse_args()
    if DRY:
        args.rows, args.inter, args.calls, args.reps = 3, 64, 2, 1
    from trace_rl.engine.timing import graph_median_us
    from trace_rl.kernels import swiglu

    def timed_us(calls):
        if not DRY:
            return graph_median_us(calls, reps=args.reps)
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) * 1e6 / len(calls)

    t0 = time.time()
    res = {"rows": args.rows, "inter": args.inter, "fmt": args.fmt, "calls": args.calls, "reps": args.reps,
           "device": "cpu (dry)" if DRY else torch.cuda.get_device_name(), "torch": torch.__version__,
           "exact_silu_default": swiglu.EXACT_SILU}
    gen = torch.Generator(device=DEV).manual_seed(0)
    x = (torch.randn(args.rows, 2 * args.inter, device=DEV, generator=gen) * 2).to(torch.bfloat16)
    copies = 2 if DRY else max(2, -(-(200 << 20) // x.nbytes))          # cold: > 200 MiB of inputs, so replays read HBM
    xs = [x.clone() for _ in range(copies)]
    res["cold_copies"] = copies

    try:   # bits, this run
        want, want_scale = torch_apart(x, args.fmt)
        got, got_scale = with_silu_form(True, lambda: fused(x, args.fmt))
        fast, fast_scale = with_silu_form(False, lambda: fused(x, args.fmt))
        got8, _ = with_silu_form(True, lambda: fused_8_warps(x, args.fmt))
        res["bits"] = {"fused_exact_vs_apart": mismatches(got, want),
                       "fused_exact_8_warps_vs_apart": mismatches(got8, want),
                       "fused_fast_vs_apart": mismatches(fast, want)}
        if want_scale is not None:
            res["bits"]["row_scale_exact_vs_apart"] = mismatches(got_scale, want_scale)
            res["bits"]["row_scale_fast_vs_apart"] = mismatches(fast_scale, want_scale)
        e = every_gate(1 if DRY else 8)
        ref = swiglu.silu_mul_reference(e)
        res["bits"]["silu_mul_every_gate_exact_vs_torch"] = mismatches(
            with_silu_form(True, lambda: swiglu.silu_mul(e)), ref)
        res["bits"]["silu_mul_every_gate_fast_vs_torch"] = mismatches(
            with_silu_form(False, lambda: swiglu.silu_mul(e)), ref)
        exact_ok = (res["bits"]["fused_exact_vs_apart"]["bits"] == 0
                    and res["bits"]["fused_exact_vs_apart"]["nan_positions"] == 0
                    and res["bits"]["silu_mul_every_gate_exact_vs_torch"]["bits"] == 0)
        res["bits"]["exact_bit_identical"] = exact_ok
    except Exception as ex:
        res["bits_error"] = repr(ex)
        traceback.print_exc()

    variants = {"apart": (True, torch_apart), "fused_exact": (True, fused), "fused_fast": (False, fused),
                "fused_exact_8_warps": (True, fused_8_warps),
                "silu_mul_kernel_then_quantize": (True, kernel_then_quantize)}
    res["us"] = {}
    for name, (exact, fn) in variants.items():
        row = {}
        for temp, inputs in (("hot", [x] * args.calls), ("cold", [xs[i % copies] for i in range(args.calls)])):
            try:
                calls = [lambda t=t, fn=fn: fn(t, args.fmt) for t in inputs]
                row[temp] = round(with_silu_form(exact, lambda c=calls: timed_us(c)), 2)
            except Exception as ex:
                row[f"{temp}_error"] = repr(ex)
                traceback.print_exc()
        res["us"][name] = row
        print(name, row, flush=True)
    us = res["us"]
    for temp in ("hot", "cold"):
        a, f = us.get("apart", {}).get(temp), us.get("fused_exact", {}).get(temp)
        if a is not None and f is not None:
            res[f"saved_us_per_layer_{temp}"] = round(a - f, 2)
            res[f"saved_us_per_step_{temp}"] = round((a - f) * args.layers, 1)
            res[f"speedup_{temp}"] = round(a / f, 3)
    res["wall_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))
    return 0 if DRY or res.get("bits", {}).get("exact_bit_identical") else 1


if __name__ == "__main__":
    sys.exit(main())
