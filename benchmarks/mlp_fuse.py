"""The FP4 rollout's MLP tail with the stacked gate/up GEMM's epilogue fused into the SiLU x mul W4A4 quantize
(issue 16; trace_rl/kernels/epilogue_silu_quantize.py), against today's tail, on one H200.

    python benchmarks/mlp_fuse.py OUT.json [--budget-s 45] [--layers 8]

1. Kernel level, Qwen3-8B's gate/up (2 x 12288 x 4096, nvfp4, one stacked operand cache, random weights) and the
   down projection's nvfp4:row input, M = 313, 1, 16, 512 (the engine takes this path from
   `fp4_dequant.DEQUANT_CUBLAS_MIN_M` = 128 rows on; 1 and 16 for the shape of the cost), bf16:
   - `bits`: fused operand and row scale == the two launches', in this run (NaN positions compared);
   - CUDA-graph medians (`engine.timing.graph_median_us`: 4 calls over 4 distinct inputs per graph, 15 replays
     after 3 warm-up): `today_us` = cuBLAS + epilogue (`stacked_matmul`) + SiLU x mul quantize
     (`quantize_dequant_bf16(silu_mul=True)`); `fused_us` = cuBLAS + the fused launch (`stacked_silu_mul_quantize`);
     and the parts alone: `gemm_us` (cuBLAS, float32 out), `epilogue_us`, `silu_quantize_us`, `fused_kernel_us`;
     informational `fused_kernel_maxnreg64_us` (the fused kernel capped at 64 registers: 91 -> 64, two programs
     per SM, 32 bytes spilled; its bits compared too).
2. Engine level (if the budget allows): Qwen3-8B shape, first `--layers` layers, w4a4-kv4, page pool, Triton
   attention kernels, operand cache stacked, B = 313, L = 257 (KV random): the CUDA-graph step median
   (`decode_grid.time_step`) and the eager logits with (a) every fusion on, (b) `decoder.FUSE_ROLLOUT_EPILOGUE_
   SILU_QUANTIZE` off, (c) that and `norm_input.FUSE_NORM_QUANTIZE` off; logits of (b) and (c) compared with (a)
   (they must be bit-identical), graphs re-captured between.
Every timing and its baseline come from this run. No new measurement starts after --budget-s.
MLPFUSE_SMOKE=1: CPU dry run (interpreter, 64 -> 2 x 96 shapes, wall-clock "timings", no engine part): the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SMOKE = os.environ.get("MLPFUSE_SMOKE") == "1"
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEV = "cpu" if SMOKE else "cuda"
K_IN, K_MID = (64, 96) if SMOKE else (4096, 12288)
ROWS = (3, 1) if SMOKE else (313, 1, 16, 512)
SETS = 2 if SMOKE else 4


def graph_median_us(calls, reps=15, warmup=3) -> float:
    if SMOKE:
        t = time.perf_counter()
        for fn in calls:
            fn()
        return (time.perf_counter() - t) * 1e6 / len(calls)
    from trace_rl.engine.timing import graph_median_us as timed

    return timed(calls, reps=reps, warmup=warmup)


def same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    ok = ~a.isnan()
    view = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return bool(torch.equal(a.view(view)[ok], b.view(view)[ok]))


def kernel_rows(rep, deadline, log):
    from trace_rl.backends import get_backend
    from trace_rl.kernels.epilogue_silu_quantize import epilogue_silu_mul_quantize
    from trace_rl.kernels.fp4_dequant import accumulate
    from trace_rl.kernels.operand_cache import attach_stacked, stacked_matmul, stacked_silu_mul_quantize
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    g = torch.Generator().manual_seed(0)
    backend = get_backend("fp4")
    parts = [backend.prepare_weight((torch.randn(K_MID, K_IN, generator=g) * s).to(torch.bfloat16).to(DEV), "nvfp4")
             for s in (0.02, 0.03)]
    st = attach_stacked(parts)
    act = "nvfp4:row"
    for m in ROWS:
        if time.time() > deadline:
            rep["skipped"].append(f"kernel M={m}: budget")
            continue
        try:
            sets = []
            for _ in range(SETS):
                xq, rs = quantize_dequant_bf16((torch.randn(m, K_IN, generator=g) * 3).to(torch.bfloat16).to(DEV), act)
                sets.append((xq, rs, accumulate(xq, st.buf)))
            xq, rs, y = sets[0]
            fused, fused_rs = stacked_silu_mul_quantize(xq, st, rs, act)
            apart, apart_rs = quantize_dequant_bf16(stacked_matmul(xq, st, rs), act, silu_mul=True)
            y_nan = y.clone()
            y_nan[0, :5] = float("nan")
            f2, _ = epilogue_silu_mul_quantize(y_nan, st.row_factor, rs, act)
            a2, _ = quantize_dequant_bf16(factor_matmul_epilogue(y_nan, st, rs), act, silu_mul=True)
            row = {"M": m, "bits": {"operand": same_bits(fused, apart), "row_scale": same_bits(fused_rs, apart_rs),
                                    "nan_row_operand": same_bits(f2, a2)}}
            t = lambda fn, sets=sets: graph_median_us([lambda s=s: fn(*s) for s in sets], reps=15, warmup=3)  # noqa: E731
            row["today_us"] = t(lambda x, r, _y: quantize_dequant_bf16(stacked_matmul(x, st, r), act, silu_mul=True))
            row["fused_us"] = t(lambda x, r, _y: stacked_silu_mul_quantize(x, st, r, act))
            row["gemm_us"] = t(lambda x, r, _y: accumulate(x, st.buf))
            gu = [stacked_matmul(x, st, r) for x, r, _ in sets]
            row["epilogue_us"] = t(lambda x, r, yy: factor_matmul_epilogue(yy, st, r))
            row["silu_quantize_us"] = graph_median_us(
                [lambda v=v: quantize_dequant_bf16(v, act, silu_mul=True) for v in gu], reps=15, warmup=3)
            row["fused_kernel_us"] = t(lambda x, r, yy: epilogue_silu_mul_quantize(yy, st.row_factor, r, act))
            if not SMOKE:   # informational: capped at 64 registers (2 programs of 16 warps per SM; spills 32 B)
                try:
                    f64, _ = epilogue_silu_mul_quantize(y, st.row_factor, rs, act, maxnreg=64)
                    row["maxnreg64_operand_bits"] = same_bits(f64, apart)
                    row["fused_kernel_maxnreg64_us"] = t(
                        lambda x, r, yy: epilogue_silu_mul_quantize(yy, st.row_factor, r, act, maxnreg=64))
                except Exception as err:   # noqa: BLE001 - the shipped rows stand without it
                    row["maxnreg64_error"] = f"{type(err).__name__}: {str(err)[:200]}"
            row["saved_us"] = row["today_us"] - row["fused_us"]
            row["speedup"] = row["today_us"] / row["fused_us"]
            rep["kernel"].append(row)
            log(f"kernel M={m}: {row}")
        except Exception:   # noqa: BLE001 - one M failing keeps the others
            rep["errors"].append({"what": f"kernel M={m}", "trace": traceback.format_exc()})
            log(f"kernel M={m}: FAILED")


def factor_matmul_epilogue(y, st, rs):
    """`factor_matmul`'s epilogue alone on the accumulator y (what today's tail runs after cuBLAS)."""
    import triton

    from trace_rl.kernels.fp4_dequant import EPI_BM, EPI_BN, _epilogue_kernel

    m, n = y.shape
    out = torch.empty(m, n, dtype=torch.bfloat16, device=y.device)
    _epilogue_kernel[(triton.cdiv(m, EPI_BM), triton.cdiv(n, EPI_BN))](
        y, st.row_factor, rs if rs is not None else st.row_factor, st.row_factor, out, m, n, y.stride(0),
        out.stride(0), HAS_ROW_SCALE=rs is not None, HAS_BIAS=False, BM=EPI_BM, BN=EPI_BN, num_warps=4)
    return out


def engine_rows(rep, deadline, layers, log):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from engine_step_profile import forward_logits

    from trace_rl.bench import measure as bm
    from trace_rl.bench.decode_grid import time_step
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import decoder, norm_input
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset("w4a4-kv4")
    b, length = 313, 257
    engine = model = None
    configs = (("all_fused", True, True), ("epilogue_apart", False, True), ("epilogue_and_norms_apart", False, False))
    try:
        model = bm.build_rollout_model("qwen3-8b", plan, torch.device("cuda"), torch.bfloat16, 0, layers)
        engine = NativeEngine(model, plan, max_batch=b, max_seq_len=length + 1, device="cuda", graph_buckets=[b],
                              kv_layout="pool", attention="kernels", operand_cache=True)
        bm.fill_random(engine.cache, torch.Generator(device="cuda").manual_seed(0))
        logits = {}
        for name, epi, norm in configs:
            if time.time() > deadline:
                rep["skipped"].append(f"engine {name}: budget")
                continue
            decoder.FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE, norm_input.FUSE_NORM_QUANTIZE = epi, norm
            engine.graphs.invalidate()
            step = time_step(engine, b, length, 10)
            logits[name] = forward_logits(engine, b, length)
            row = {"config": name, "layers": layers, "B": b, "L": length, "graph_step_ms": step}
            if name != "all_fused" and "all_fused" in logits:
                row["logits_bit_identical_to_all_fused"] = same_bits(logits[name], logits["all_fused"])
            rep["engine"].append(row)
            log(f"engine {row}")
        steps = {r["config"]: r["graph_step_ms"] for r in rep["engine"]}
        if "all_fused" in steps and "epilogue_apart" in steps:
            rep["engine_saved_ms_per_layer_epilogue"] = (steps["epilogue_apart"] - steps["all_fused"]) / layers
        if "epilogue_apart" in steps and "epilogue_and_norms_apart" in steps:
            rep["engine_saved_ms_per_layer_norms"] = (steps["epilogue_and_norms_apart"] - steps["epilogue_apart"]) \
                / layers
    except Exception:   # noqa: BLE001 - keep what was measured
        rep["errors"].append({"what": "engine", "trace": traceback.format_exc()})
        log("engine: FAILED")
    finally:
        decoder.FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE, norm_input.FUSE_NORM_QUANTIZE = True, True
        bm.free(engine, model)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=45.0)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    t0 = time.time()
    deadline = t0 + args.budget_s
    rep = {"device": "cpu (interpreter smoke)" if SMOKE else torch.cuda.get_device_name(), "kernel": [], "engine": [],
           "errors": [], "skipped": []}

    def log(msg):
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    def save():
        rep["total_s"] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)

    kernel_rows(rep, deadline, log)
    save()
    if not SMOKE:
        torch.cuda.empty_cache()
    if not SMOKE and time.time() < deadline - 15:
        engine_rows(rep, deadline, args.layers, log)
    else:
        rep["skipped"].append("engine A/B: " + ("smoke run" if SMOKE else "budget"))
    rep["all_bit_identical"] = all(all(r["bits"].values()) for r in rep["kernel"]) and all(
        r.get("logits_bit_identical_to_all_fused", True) for r in rep["engine"])
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
