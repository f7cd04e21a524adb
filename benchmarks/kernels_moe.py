"""Grouped (mixture-of-experts) FP4 GEMM at the MoE rollout's decode shapes: a config sweep with baselines, plus a
small dense-GEMM sweep (issue 15, items 2-3).

    python benchmarks/kernels_moe.py --out moe_sweep.json [--batches 128,409,512] [--dense] [--chain] [--defaults]
        [--checks tests/a.py,tests/b.py]
    python benchmarks/kernels_moe.py --compile-only      # CPU: compile every swept config for sm_90 (SASS/elem)

Grouped: Qwen3-30B-A3B experts (hidden 2048, 128 experts of intermediate 768, top-8), gate+up [1536 x 2048] and
down [2048 x 768], 8 B routed rows for B sequences (random top-8 router: uneven counts), nvfp4 and mxfp4, W4A16,
W4A4 with the separate quantize launch ("a4sep") and W4A4 quantized inside the grouped kernel ("a4fused").
Every config's output is checked against the torch reference (`grouped_linear_reference`, rel. error < 1e-2)
before it is timed. Baselines in the same run: `torch._grouped_mm` (BF16) and a per-expert cuBLAS loop captured
in a CUDA graph. bw = (active experts' FP4 bytes + bf16 activations read) / time / measured read ceiling.
Dense: nvfp4 W4A16 tile/split candidates at 4096x12288 and 12288x4096, M = 1, 16, 64, against cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernels_moe_shapes as shapes  # noqa: E402  (tiles: `main` may replace them)
from kernels_moe_layer import moe_chain, sweep_dense  # noqa: E402
from kernels_moe_shapes import (  # noqa: E402, F401  (grouped_configs: imported by kernels.py)
    DENSE_M,
    DENSE_SHAPES,
    DEV,
    GEMMS,
    MOE,
    SMOKE,
    dense_configs,
    grouped_configs,
    rel_err,
    routing,
    time_us,
    variants,
)

# -- compile -----------------------------------------------------------------------------------------------------

def compile_only(path: str | None) -> int:
    """Compile every swept config for sm_90 on this machine (Triton's ptxas; no GPU) and report SASS per weight
    element of the K loop, registers and spills. Exit 1 if a config fails to compile."""
    from trace_rl.kernels.fp4_gemm import gemm_gate_case
    from trace_rl.kernels.fp4_grouped import grouped_gate_case
    from trace_rl.kernels.sass_gate import compile_sass, inspect

    cases = [grouped_gate_case(c, f, budget=99, act=None if a == "a16" else ("nvfp4:row" if f == "nvfp4" else f))
             for f, a, c in variants() if a != "a4sep"]
    seen = set()
    for M in DENSE_M:
        for c in dense_configs(M):
            key = (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages)
            if key not in seen:
                seen.add(key)
                cases.append(gemm_gate_case(c, "nvfp4", budget=99))
    reports, failed = [], 0
    for case in cases:
        try:
            r = inspect(case, *compile_sass(case))
            reports.append({"name": r.name, "sass_per_elem": round(r.per_element, 2), "regs": r.registers,
                            "spills": r.spills, "shared": r.shared_bytes,
                            "violations": [v for v in r.violations if "budget" not in v]})
            print(f"{r.name:<44} {r.per_element:6.2f} SASS/elem {r.registers:4d} regs {r.spills:3d} spills",
                  flush=True)
        except Exception as e:   # noqa: BLE001
            failed += 1
            reports.append({"name": case.name, "error": repr(e)[:300]})
            print(f"FAIL {case.name}: {e!r}"[:300], flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(reports, f, indent=1)
    return 1 if failed else 0


def _compile_job(job):
    fmt, tag, cfg = job
    try:
        from trace_rl.backends.fp4 import prepare_expert_weights
        from trace_rl.kernels.fp4_gemm import GemmConfig
        from trace_rl.kernels.linear import fp4_grouped_linear

        c = GemmConfig(**dict(cfg))
        g = torch.Generator(device=DEV).manual_seed(0)
        ex = prepare_expert_weights(torch.randn(4, 512, 2048, device=DEV, generator=g), fmt)
        x = torch.randn(40, 2048, device=DEV, generator=g).to(torch.bfloat16)
        off = torch.tensor([0, 8, 16, 24, 32], device=DEV, dtype=torch.int32)
        fp4_grouped_linear(x, off, ex, "bf16" if tag == "a16" else fmt, config=c, fuse_act_quant=tag == "a4fused")
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def _any_job(job):
    from kernel_baselines import _compile_one

    return _compile_one(job) if len(job) == 4 else _compile_job(job)


def precompile_grouped(workers: int, dense_too: bool, batches: list[int], sweep: bool = True) -> list[str]:
    """Compile the variants this run times in `workers` processes (the disk cache is shared); with `sweep`
    False only the launchers' defaults at these batches."""
    from concurrent.futures import ProcessPoolExecutor

    from trace_rl.kernels.fp4_gemm import default_config
    from trace_rl.kernels.fp4_grouped import default_grouped_config

    if sweep:
        grouped = variants()
        dense_cfgs = [c for M in DENSE_M for c in dense_configs(M)]
    else:
        defaults = {default_grouped_config(b * MOE["top_k"], MOE["experts"]) for b in batches}
        grouped = [(f, t, c) for f in ("nvfp4", "mxfp4") for t in ("a16", "a4sep") for c in defaults]
        dense_cfgs = [default_config(M, N, K) for M in DENSE_M for K, N in DENSE_SHAPES]
    jobs = [(f, t, tuple(c.__dict__.items())) for f, t, c in grouped
            if not (t == "a4sep" and f == "mxfp4")]   # mxfp4 a4sep = the a16 binary (no row scale)
    dense = {tuple((n, 1 if n == "split_k" else v) for n, v in c.__dict__.items())
             for c in dense_cfgs} if dense_too else set()
    ctx = __import__("multiprocessing").get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        all_jobs = jobs + [("dense", "nvfp4", "bf16", c) for c in sorted(dense)]
        return [e for e in pool.map(_any_job, all_jobs) if e]


# -- measure -----------------------------------------------------------------------------------------------------


def sweep_grouped(batches: list[int], read_bw: float, log, deadline: float, sweep: bool = True,
                  gemms: tuple = ("gate_up", "down")) -> list:
    """Per GEMM, B, format and activation variant: every swept config (`sweep`), or only the launcher's
    default (cfg "default"; variants a16 and a4sep), each checked against the torch reference, then timed."""
    from kernel_baselines import cublas_expert_loop, grouped_mm_call

    from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
    from trace_rl.kernels.linear import fp4_grouped_linear, hopper_weight
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    E, k = MOE["experts"], MOE["top_k"]
    gen = torch.Generator(device=DEV).manual_seed(0)
    rows_out = []
    for name, N, K in [g for name in gemms for g in GEMMS if g[0] == name]:     # in the order asked
        w = torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
        experts = {f: prepare_expert_weights(w, f) for f in ("nvfp4", "mxfp4")}
        lay_bytes = {f: hopper_weight(experts[f]).nbytes for f in experts}
        w_t = w.transpose(1, 2)
        for B in batches:
            if time.time() > deadline:
                log({"skipped": f"{name} B={B}: out of time"})
                continue
            offsets, offs = routing(B, E, k, gen)
            R = B * k
            counts = [offs[e + 1] - offs[e] for e in range(E)]
            x = torch.randn(R, K, device=DEV, dtype=torch.bfloat16, generator=gen)
            out = torch.empty(R, N, device=DEV, dtype=torch.bfloat16)
            active = sum(1 for c in counts if c)
            row = {"gemm": name, "N": N, "K": K, "B": B, "rows": R, "active_experts": active,
                   "rows_per_expert": {"min": min(counts), "mean": R / E, "max": max(counts)}}
            try:
                row["cublas_loop_us"] = time_us([cublas_expert_loop(x, w, offs, out)], reps=10)
            except Exception as e:   # noqa: BLE001
                row["cublas_loop_error"] = repr(e)[:300]
            call, why = grouped_mm_call(x, w_t, offsets[1:])
            if call is not None:
                row["grouped_mm_us"] = time_us([call], reps=10)
            else:
                row["grouped_mm_error"] = why
            base = min([row[kk] for kk in ("cublas_loop_us", "grouped_mm_us") if kk in row] or [float("nan")])
            row["bf16_best_us"] = base
            for fmt in ("nvfp4", "mxfp4"):
                ex = experts[fmt]
                read_bytes = lay_bytes[fmt] * active / E + 2 * R * K
                row[f"{fmt}_floor_us"] = read_bytes / read_bw * 1e6
                for tag in ("a16", "a4sep") + (("a4fused",) if sweep and shapes.FUSED_TILES else ()):
                    act = "bf16" if tag == "a16" else fmt
                    try:
                        ref = grouped_linear_reference(x, offsets, ex, act)
                    except Exception as e:   # noqa: BLE001
                        row[f"{fmt}_{tag}_ref_error"] = repr(e)[:300]
                        continue
                    res = []
                    tiles = shapes.FUSED_TILES if tag == "a4fused" else shapes.GROUPED_TILES
                    cfgs = grouped_configs(tiles) if sweep else [None]
                    for c in cfgs:
                        def fn(c=c, a=act, t=tag, x=x, o=offsets, ex=ex):
                            return fp4_grouped_linear(x, o, ex, a, config=c, fuse_act_quant=t == "a4fused")
                        entry = {"cfg": "default" if c is None else
                                 [c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages] + (["dual"] * c.dual)}
                        try:
                            err = rel_err(fn(), ref)
                            entry["rel_err"] = err
                            if not err < 1e-2:
                                entry["error"] = f"rel err {err:.3g} vs the torch reference"
                            else:
                                us = time_us([fn], reps=10)
                                entry.update(us=round(us, 2), x_bf16_best=round(base / us, 3),
                                             bw=round(read_bytes / (us * 1e-6) / read_bw, 3))
                        except Exception as e:   # noqa: BLE001
                            entry["error"] = repr(e)[:300]
                        res.append(entry)
                    row[f"{fmt}_{tag}"] = res
                    ok = [r for r in res if "us" in r]
                    if ok:
                        best = min(ok, key=lambda r: r["us"])
                        row[f"{fmt}_{tag}_best"] = best
                if fmt == "nvfp4":   # the separate quantize launch on its own
                    try:
                        row["quantize_launch_us"] = time_us(
                            [lambda x=x: quantize_dequant_bf16(x, "nvfp4:row")], reps=10)
                        xb = x[: B]   # quantizing the B tokens before the permute (8x fewer rows)
                        row["quantize_tokens_us"] = time_us([lambda xb=xb: quantize_dequant_bf16(xb, "nvfp4:row")],
                                                             reps=10)
                    except Exception as e:   # noqa: BLE001
                        row["quantize_error"] = repr(e)[:300]
            log(row)
            rows_out.append(row)
        del w, w_t, experts
        torch.cuda.empty_cache()
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="moe_sweep.json")
    ap.add_argument("--batches", default="128,409,512")
    ap.add_argument("--dense", action="store_true", help="also the small dense sweep")
    ap.add_argument("--defaults", action="store_true", help="only the launchers' default configs (no sweep)")
    ap.add_argument("--fused-tiles", action="store_true", help="also W4A4 quantized in the grouped kernel")
    ap.add_argument("--gemms", default="gate_up,down", help="grouped GEMMs to run (gate_up, down)")
    ap.add_argument("--tiles", default="", help="grouped sweep tiles BMxBNxBKwWsS[d],... (d: dual halves; default: "
                    "GROUPED_TILES)")
    ap.add_argument("--chain", action="store_true", help="also one MoE layer's experts per plan (moe_chain)")
    ap.add_argument("--checks", default="", help="comma-separated test files run (GPU) while kernels compile")
    ap.add_argument("--compile-only", action="store_true", help="CPU: compile every config for sm_90, no GPU")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--budget-s", type=float, default=85.0, help="stop starting new shapes after this")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke test: interpreter, tiny shapes")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        print(f"--batches: comma-separated integers, got {args.batches!r}", file=sys.stderr)
        return 2
    gemms = tuple(args.gemms.split(","))
    if not set(gemms) <= {"gate_up", "down"}:
        print(f"--gemms: gate_up and/or down, got {args.gemms!r}", file=sys.stderr)
        return 2
    if args.tiles:
        try:
            shapes.GROUPED_TILES = [tuple(int(v) for v in re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", t[:-1] if
                                                                t.endswith("d") else t).groups()) + (t.endswith("d"),)
                             for t in args.tiles.split(",")]
        except AttributeError:
            print(f"--tiles: BMxBNxBKwWsS,... (e.g. 32x128x128w4s3), got {args.tiles!r}", file=sys.stderr)
            return 2
    if args.fused_tiles:
        shapes.FUSED_TILES = [(16, 128, 128, 4, 4)]
    if args.compile_only:
        return compile_only(args.out)
    from kernel_baselines import ceilings, finish_pytest, json_saver, run_env, start_pytest

    t_start = time.time()
    deadline = t_start + args.budget_s
    res = {"env": run_env("cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0))}
    save = json_saver(res, args.out)

    def log(obj):
        print(json.dumps(obj)[:4000], flush=True)
        save()

    checks = start_pytest(args.checks.split(",")) if args.checks else None   # runs while the kernels compile
    t0 = time.time()
    res["compile_errors"] = [] if SMOKE else precompile_grouped(args.jobs, args.dense, batches, not args.defaults)
    res["compile_s"] = time.time() - t0
    log({"compile_s": res["compile_s"], "errors": res["compile_errors"][:5]})
    if checks is not None:
        res["checks"] = finish_pytest(checks, max(5.0, deadline - 45 - time.time()), keep=40)
        log(res["checks"]["summary"])
    res["ceilings"] = {"read_TBps": 1.0} if SMOKE else ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    def logger(section):   # every finished row goes into the JSON at once (a timeout keeps what was measured)
        def _log(obj):
            if "skipped" not in obj:
                res.setdefault(section, []).append(obj)
            log(obj)
        return _log

    for name, fn in (("chain", lambda: moe_chain(batches, logger("chain"), deadline) if args.chain else []),
                     ("dense", lambda: sweep_dense(read_bw, logger("dense"), deadline, not args.defaults)
                      if args.dense else []),
                     ("grouped", lambda: sweep_grouped(batches, read_bw, logger("grouped"), deadline,
                                                       not args.defaults, gemms))):
        try:
            res[name] = fn()
        except Exception:   # noqa: BLE001
            res[name + "_error"] = traceback.format_exc()[-2000:]
            print(res[name + "_error"], flush=True)
        save()
    res["wall_s"] = time.time() - t_start
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
