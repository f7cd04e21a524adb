"""The Gluon W4A16 GEMM's compute part at M <= 16 (issue 15): the shipped launch and the variants of
benchmarks/gemm_compute_kernels.py, each full and compute-only, against cuBLAS BF16.

    python benchmarks/gemm_compute.py --out gemm_compute.json [--budget-s 75]     # an sm_90 GPU, Triton 3.6
    python benchmarks/gemm_compute.py --dry --out compile.json                    # CPU: plans + sm_90 SASS facts

Per format (nvfp4, mxfp4), shape (K x N = 4096x12288, 12288x4096) and M (1, 16): cuBLAS BF16 `F.linear`; then for
`shipped` (the launcher's config before SMALL_M shipped, DEFAULT, through this module's launcher, checked bit-equal
to `fp4_matmul_gluon(..., DEFAULT)`) and
each variant: the full launch's output against the torch reference (x @ dequantize(W)^T in float32: `rel_ref`,
relative Frobenius error, must be < 1e-2 before it is timed) and against the shipped output (`rel_shipped`,
`bit_equal_shipped`: equal where the split and the wgmma k16 order are the same), then the full and the compute-only
launch, and the compute-only launch with no K step (`no_k_steps_us`: launch, setup and the split-K epilogue, the
fixed cost), timed as benchmarks/gemm_gluon.py times (every call captured over weight copies larger than L2 in one CUDA
graph, median of 15 replays after 3 warm-up replays, microseconds per call); `speedup` = cuBLAS us / us. With each:
the plan (grid, K steps per program, CTAs per SM, waves, the busiest SM's weight elements over the mean) and the
compiled kernel's registers / spills / shared bytes. All kernels compile first in worker processes. The JSON is
rewritten after every row; past `--budget-s` no new (format, shape) starts ("skipped").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gemm_compute_kernels as gc  # noqa: E402

SHAPES = [(4096, 12288), (12288, 4096)]   # (K, N)
MS = (1, 16)
FMTS = ("nvfp4", "mxfp4")
DEV = "cuda"


def plan_facts(M: int, N: int, K: int, fmt: str, v, sms: int = 132) -> dict:
    p = gc.plan(M, N, K, fmt, v, sms)
    c = p.pop("config")
    p["busiest_over_mean"] = round(p["busiest_sm_elements"] / p["mean_sm_elements"], 3)
    p["config"] = dict(block_n=c.block_n, stages=c.stages, num_warps=c.num_warps, overlap=c.overlap,
                       maxnreg=c.maxnreg, bk=p["bk"])
    p["grid"] = list(p["grid"])
    return p


def dry(out: str) -> int:
    """CPU: every launch's plan, and every kernel compiled for sm_90 (sass_gate) with its SASS facts."""
    import json
    import re

    from trace_rl.kernels import sass_gate as sg

    res = {"plans": [], "compile": [], "errors": []}
    for fmt in FMTS:
        for K, N in SHAPES:
            for M in MS:
                for v in [v for v in (gc.SHIPPED, ) + gc.VARIANTS if fmt in v.fmts]:
                    try:
                        res["plans"].append({"fmt": fmt, "K": K, "N": N, "M": M, "variant": v.name,
                                             **plan_facts(M, N, K, fmt, v)})
                    except Exception as e:   # noqa: BLE001
                        res["errors"].append(f"plan {fmt} {K}x{N} M {M} {v.name}: {e!r}")
    for v, fmt, bm, mode in gc.all_cases():
        case = gc.gate_case(v, fmt, bm, mode)
        try:
            sass, use = sg.compile_sass(case)
        except Exception as e:   # noqa: BLE001
            res["errors"].append(f"compile {case.name}: {e!r}"[:600])
            continue
        r = sg.inspect(case, sass, use)
        body = sg.main_loop(sass)
        full_waits = sum(1 for t in body if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", t))
        int_ops = sum(n for op, n in r.opcodes.items() if op.split(".")[0] in ("LOP3", "SHF", "PRMT", "LEA", "IADD3"))
        res["compile"].append({"case": case.name, "variant": v.name, "fmt": fmt, "bm": bm, "mode": mode,
                               "sass_per_element": round(r.per_element, 3), "loop_instructions": r.loop_instructions,
                               "int_pipe_per_element": round(int_ops / case.elements_per_thread, 3),
                               "registers": r.registers, "spills": r.spills, "full_waits_in_loop": full_waits,
                               "hgmma": r.opcodes.get("HGMMA.64", 0), "violations": r.violations,
                               "opcodes": dict(list(r.opcodes.items())[:12])})
        print(f"{case.name}: {r.per_element:.2f} SASS/elem, INT {int_ops / case.elements_per_thread:.2f}/elem, "
              f"{r.registers} regs, {r.spills} B spilled, {full_waits} full waits", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    for e in res["errors"]:
        print("ERROR", e)
    return 1 if res["errors"] else 0


def _compile_job(job: tuple) -> str:
    """Worker (spawn): run one (variant, fmt, M, mode) launch on small weights, filling Triton's on-disk cache (the
    binary depends on the variant's config and K step, the format, BM and mode, and on whether the launch splits K:
    split 1 passes the row factors as the unused float32 partials / counters; N, M, K steps and the split itself are
    not specialised). 512x1024 does not split mxfp4 (2 K steps; as mxfp4 4096x12288's shipped launch), 128x4096
    splits every variant; N is a multiple of 16 like the benchmark's (out's row stride)."""
    name, fmt, M, mode = job
    try:
        import torch

        from trace_rl.backends import PackedWeight
        from trace_rl.kernels import quantize
        from trace_rl.kernels.linear import hopper_weight

        v = {x.name: x for x in (gc.SHIPPED, ) + gc.VARIANTS}[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        for N, K in ((512, 1024), (128, 4096)):
            w = torch.randn(N, K, device="cuda", generator=g).to(torch.bfloat16)
            h = hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
            x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            (gc.full if mode == "full" else gc.compute_only)(x, h, v, out)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(workers: int = 16, timeout_s: float = 50.0, jobs: list | None = None, job_fn=None, ctx: str = "spawn"):
    """Every (variant, fmt, M, mode) launch in `workers` processes (`_compile_job`). A job still running after
    `timeout_s` (a kernel that never finishes would hang the run) has its workers killed. Returns (errors, hung
    (variant, fmt) pairs: the benchmark skips those)."""
    from concurrent.futures import ProcessPoolExecutor, wait
    from multiprocessing import get_context

    if jobs is None:
        jobs = [(v.name, fmt, M, mode) for v in (gc.SHIPPED, ) + gc.VARIANTS for fmt in v.fmts for M in MS
                for mode in ("full", "compute")]
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context(ctx))
    futs = {pool.submit(job_fn or _compile_job, j): j for j in jobs}
    done, pending = wait(futs, timeout=timeout_s)
    errors = [e for e in (f.result() for f in done) if e]
    hung = sorted({(futs[f][0], futs[f][1]) for f in pending})
    if pending:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return errors, hung


def precompile_exit(run) -> int:
    """How a bench's --precompile-only ends: run() -> (errors, hung) as `precompile` returns them, printed with the
    seconds it took; the exit code 1 on any error or hung job, else 0."""
    t0 = time.time()
    errors, hung = run()
    print({"precompile_s": round(time.time() - t0, 1), "errors": errors, "hung": hung}, flush=True)
    return 1 if errors or hung else 0


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _facts(kern) -> dict:
    return {"registers": kern.n_regs, "spills": kern.n_spills, "shared_bytes": kern.metadata.shared}


def measure(args) -> None:
    import torch
    import torch.nn.functional as F
    from kernel_baselines import graph_us, json_saver, run_env, weight_copies

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm_gluon import DEFAULT, fp4_matmul_gluon  # `shipped`: DEFAULT (the probes' baseline)
    from trace_rl.kernels.hopper_fp4 import dequantize
    from trace_rl.kernels.linear import hopper_weight

    start = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "rows": [], "skipped": [], "errors": []}
    # (the CPU test of this bookkeeping replaces the launches, the timing and these torch.cuda calls)
    save = json_saver(res, args.out)
    hung = []
    if not args.no_precompile:
        t0 = time.time()
        try:
            res["precompile_errors"], hung = precompile()
        except Exception as e:   # noqa: BLE001 -- compiling in the timed loop instead is slower, not wrong
            res["precompile_errors"] = [repr(e)[:300]]
        res["precompile_s"] = round(time.time() - t0, 1)
        res["precompile_hung"] = hung
        save()
    dev = DEV
    for fmt in FMTS:
        for K, N in SHAPES:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"K": K, "N": N, "fmt": fmt})
                continue
            torch.manual_seed(0)
            n_copies = weight_copies(N * K // 2)
            w_bf16 = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
            hws = [hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt))) for w in w_bf16]
            w_ref = dequantize(hws[0])                       # float32 [N, K]
            for M in MS:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                ref = x.float() @ w_ref.T
                row = {"K": K, "N": N, "M": M, "fmt": fmt, "copies": n_copies}
                try:
                    row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
                except Exception as e:   # noqa: BLE001
                    res["errors"].append(f"{fmt} {K}x{N} M {M} cublas: {e!r}"[:400])
                y_ship = None
                for v in [v for v in (gc.SHIPPED, ) + gc.VARIANTS if fmt in v.fmts]:
                    r = {}
                    if [v.name, fmt] in [list(h) for h in hung]:
                        row[v.name] = {"skipped": "its precompile job did not finish in time"}
                        continue
                    try:
                        r["plan"] = plan_facts(M, N, K, fmt, v, sms)
                        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
                        kern, _ = gc.full(x, hws[0], v, out)
                        torch.cuda.synchronize()
                        y = out.clone()
                        r["full_kernel"] = _facts(kern)
                        r["rel_ref"] = _rel(y, ref)
                        r["finite"] = bool(torch.isfinite(y).all())
                        if v is gc.SHIPPED:
                            y_ship = y
                            r["bit_equal_fp4_matmul_gluon"] = bool(torch.equal(y, fp4_matmul_gluon(x, hws[0], DEFAULT)))
                        elif y_ship is not None:
                            r["rel_shipped"] = _rel(y, y_ship)
                            r["bit_equal_shipped"] = bool(torch.equal(y, y_ship))
                        r["ok"] = r["finite"] and r["rel_ref"] < 1e-2
                        if r["ok"]:
                            r["full_us"] = graph_us([lambda h=h, x=x, v=v, o=out: gc.full(x, h, v, o) for h in hws])
                            if "cublas_bf16_us" in row:
                                r["full_speedup"] = row["cublas_bf16_us"] / r["full_us"]
                        else:
                            res["errors"].append(f"{fmt} {K}x{N} M {M} {v.name}: rel_ref {r['rel_ref']:.3g}, "
                                                 f"finite {r['finite']}: not timed")
                        oc = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
                        kern, _ = gc.compute_only(x, hws[0], v, oc)
                        torch.cuda.synchronize()
                        r["compute_kernel"] = _facts(kern)
                        r["compute_only_us"] = graph_us([lambda h=h, x=x, v=v, o=oc: gc.compute_only(x, h, v, o)
                                                         for h in hws])
                        r["no_k_steps_us"] = graph_us([lambda h=h, x=x, v=v, o=oc: gc.compute_only(x, h, v, o, 0)
                                                       for h in hws])
                    except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
                        res["errors"].append(f"{fmt} {K}x{N} M {M} {v.name}: {e!r}"[:400])
                    row[v.name] = r
                res["rows"].append(row)
                save()
                print({k: (round(v.get("full_us", -1), 2), round(v.get("compute_only_us", -1), 2))
                       if isinstance(v, dict) else v for k, v in row.items()}, flush=True)
            del hws, w_bf16, w_ref
            torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


def main(doc: str = __doc__, dry_fn=None, measure_fn=None) -> int:
    """The command line of this benchmark, and of gemm_fixed.py (its `dry` / `measure` given)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=75.0, help="start no new (format, shape) after this")
    ap.add_argument("--dry", action="store_true", help="CPU: plans and sm_90 compile facts only")
    ap.add_argument("--no-precompile", action="store_true")
    args = ap.parse_args()
    if args.dry:
        return (dry_fn or dry)(args.out)
    (measure_fn or measure)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
