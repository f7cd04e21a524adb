"""The fixed cost of the Gluon W4A16 FP4 GEMM at M <= 16 (issue 15): launch floor, setup, split-K epilogue, and
the variants of benchmarks/gemm_fixed_kernels.py that cut it, against cuBLAS BF16.

    python benchmarks/gemm_fixed.py --out gemm_fixed.json [--budget-s 75]     # an sm_90 GPU, Triton 3.6
    python benchmarks/gemm_fixed.py --dry --out compile.json                  # CPU: plans + sm_90 SASS facts

Per format (nvfp4, mxfp4), shape (K x N = 4096x12288, 12288x4096) and M (1, 16), all timed as
benchmarks/gemm_gluon.py times (one CUDA graph of `copies` calls over weight copies larger than L2, median of 15
replays after 3 warm-up, microseconds per call):
- `cublas_bf16_us`: F.linear at the shape; `cublas_tiny_k_us`: F.linear at the same M and N with K = 256 (cuBLAS's
  own fixed cost: launch + epilogue, almost no K);
- `empty_us[grid]`: an empty Gluon kernel (4 warps) at each variant's grid: the launch floor of back-to-back
  kernels in a graph, which no variant avoids;
- `empty_pdl_us`: the same empty kernel launched with PDL (launch_dependents + wait): the overlapped launch floor;
- per variant (`shipped`: the launcher's own config; `n64_k512`, `n64_fin`, `n64_nosplit`, `n64_fin_pdl`: n64_fin
  with programmatic dependent launch, each call overlapping the previous one's tail; `n64_nosplit_pdl`: the same at
  split 1): the full launch's output against the torch reference (x @ dequantize(W)^T in float32, relative
  Frobenius error < 1e-2, else not timed) and against n64_k512's (`bit_equal_n64_k512`: n64_fin and n64_fin_pdl
  must be), then `full_us`, `compute_only_us` (no weight bytes read) and `no_k_steps_us` (the compute-only
  binary with zero K steps: launch + setup + epilogue), the plan and the compiled kernel's registers / spills /
  shared bytes;
- `split`: the fixed cost taken apart at n64's tiles: `launch_floor` = empty at n64_k512's grid, `setup_and_store` =
  n64_nosplit's no-K minus the empty kernel at its grid, `split_k_epilogue` = n64_k512's no-K minus n64_nosplit's,
  `fin_saves` = n64_k512's no-K minus n64_fin's (`fin_saves_full`: full), `pdl_saves_no_k` / `pdl_saves_full` =
  n64_fin's minus n64_fin_pdl's, `nosplit_pdl_no_k`, `launch_floor_pdl`, `cublas_fixed` (cuBLAS at K = 256).
All kernels compile first in worker processes at the real shapes (n64_fin's split is a constexpr). The JSON is
rewritten after every row; past `--budget-s` no new (format, shape) starts ("skipped").
"""

from __future__ import annotations

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gemm_compute as gcb  # noqa: E402
import gemm_compute_kernels as gc  # noqa: E402
import gemm_fixed_kernels as gf  # noqa: E402

SHAPES, MS, FMTS, DEV = gcb.SHAPES, gcb.MS, gcb.FMTS, gcb.DEV     # gemm_compute's workload
TINY_K = 256
RUN = (gc.SHIPPED, ) + gf.VARIANTS


def _variant(name: str):
    return {v.name: v for v in RUN}[name]


def epilogue_facts(sass: str) -> dict:
    """What runs outside the main (K) loop, from the consumer's side: instructions up to the last EXIT minus the
    loop's, and the long-latency events after the loop (the split-K epilogue's fences, atomics, global loads and
    stores, CTA barriers, and backward branches around global loads: a runtime-bounded reduction loop); PDL:
    griddepcontrol.wait (ACQBULK) / launch_dependents (PREEXIT) and the TMA loads placed before the first wait."""
    from trace_rl.kernels import sass_gate as sg

    lines = [(int(m.group(1), 16), m.group(2)) for m in map(sg._LINE.match, sass.splitlines()) if m]
    last_exit = max((a for a, t in lines if re.match(r"(?:@!?U?P\w+\s+)?EXIT\b", t)), default=-1)
    body = [(a, t) for a, t in lines if a <= last_exit]
    best = (0, 0, 0, -1)              # sass_gate.main_loop's choice, as an address range
    for addr, text in body:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < addr:
            span = [t for a, t in body if int(m.group(1), 16) <= a <= addr]
            best = max(best, (sum(t.startswith(("HGMMA", "HMMA")) for t in span), len(span), int(m.group(1), 16),
                              addr))
    loop = [t for a, t in body if best[2] <= a <= best[3]]
    after = [(a, t) for a, t in body if a > best[3]]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t) for _, t in after]
    back = 0
    for addr, text in after:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            span = [t for a, t in after if int(m.group(1), 16) <= a <= addr]
            back += any("LDG" in t for t in span)
    first_wait = next((a for a, t in body if t.startswith("ACQBULK")), None)
    pdl = {"gdc_wait": sum(t.startswith("ACQBULK") for _, t in body),
           "gdc_launch": sum(t.startswith("PREEXIT") for _, t in body),
           "tma_before_gdc_wait": 0 if first_wait is None else
           sum(t.startswith("UTMALDG") for a, t in body if a < first_wait)}
    return {**pdl, "instructions_total": len(body), "instructions_loop": len(loop),
            "instructions_outside_loop": len(body) - len(loop), "after_loop": len(after),
            "membar_gpu": sum(o.startswith("MEMBAR.ALL.GPU") for o in ops),
            "atomics": sum(o.startswith(("ATOMG", "RED")) for o in ops),
            "ldg": sum(o.startswith("LDG") for o in ops), "stg": sum(o.startswith("STG") for o in ops),
            "bar_sync": sum(o.startswith("BAR.SYNC") for o in ops), "load_loops": back}


def dry(out: str) -> int:
    """CPU: every launch's plan, and every kernel compiled for sm_90 with its SASS facts outside the K loop."""
    import json

    from trace_rl.kernels import sass_gate as sg

    res = {"plans": [], "compile": [], "errors": []}
    splits = set()
    for fmt in FMTS:
        for K, N in SHAPES:
            for M in MS:
                for v in RUN:
                    try:
                        p = gcb.plan_facts(M, N, K, fmt, v)
                        res["plans"].append({"fmt": fmt, "K": K, "N": N, "M": M, "variant": v.name, **p})
                        if v is gf.FIN:
                            splits.add((fmt, 8 if M == 1 else 16, p["grid"][1]))
                    except Exception as e:   # noqa: BLE001
                        res["errors"].append(f"plan {fmt} {K}x{N} M {M} {v.name}: {e!r}")
    cases = [(v, fmt, bm, mode, 2) for v in (gf.BASE, ) for fmt in FMTS for bm in (8, 16)
             for mode in ("full", "compute")]
    cases += [(v, fmt, bm, mode, s) for v in (gf.FIN, gf.FIN_PDL) for fmt, bm, s in sorted(splits)
              for mode in ("full", "compute")]
    cases += [(gf.NOSPLIT_PDL, fmt, bm, mode, 1) for fmt in FMTS for bm in (8, 16) for mode in ("full", "compute")]
    for v, fmt, bm, mode, split in cases:
        case = gf.gate_case(v, fmt, bm, mode, split)
        try:
            sass, use = sg.compile_sass(case)
        except Exception as e:   # noqa: BLE001
            res["errors"].append(f"compile {case.name}: {e!r}"[:600])
            continue
        r = sg.inspect(case, sass, use)
        e = epilogue_facts(sass)
        res["compile"].append({"case": case.name, "variant": v.name, "fmt": fmt, "bm": bm, "mode": mode,
                               "split": split, "sass_per_element": round(r.per_element, 3),
                               "registers": r.registers, "spills": r.spills, "violations": r.violations, **e})
        print(f"{case.name}: {r.registers} regs, {r.spills} B spilled, {e}", flush=True)
    try:
        for pdl in (False, True):
            ec = sg.GateCase(f"gemmfix empty{' pdl' if pdl else ''}", gf._empty_kernel, {"out_ptr": "*fp32"},
                             {"PDL": pdl}, 4, 1, 1.0, 1e9, register_a=False, whole_kernel=True, max_full_waits=99,
                             options=(("launch_pdl", True), ) if pdl else ())
            sass, use = sg.compile_sass(ec)
            body = sg.whole_kernel(sass)
            res["compile"].append({"case": ec.name, "instructions_total": len(body), "registers": use.get("REG"),
                                   "griddepcontrol": [t for t in body if t.startswith(("PREEXIT", "ACQBULK"))]})
    except Exception as e:   # noqa: BLE001
        res["errors"].append(f"compile empty: {e!r}"[:600])
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    for e in res["errors"]:
        print("ERROR", e)
    return 1 if res["errors"] else 0


def _compile_job(job: tuple) -> str:
    """Worker (spawn): one (variant, fmt, M, mode) launch at both real shapes (n64_fin's split is a constexpr, so
    the shape decides its binary), filling Triton's on-disk cache; the empty kernel too."""
    name, fmt, M, mode = job
    try:
        import torch

        from trace_rl.backends import PackedWeight
        from trace_rl.kernels import quantize
        from trace_rl.kernels.linear import hopper_weight

        v = _variant(name)
        g = torch.Generator(device="cuda").manual_seed(0)
        for K, N in SHAPES:
            w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
            h = hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
            x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            (gf.full if mode == "full" else gf.compute_only)(x, h, v, out)
        gf.empty((1, 1, 1), torch.empty(128, device="cuda"))
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def _row(res, fmt, K, N, M, x, hws, w_ref, sms, hung, graph_us):
    import torch
    import torch.nn.functional as F

    dev = DEV
    ref = x.float() @ w_ref.T
    row = {"K": K, "N": N, "M": M, "fmt": fmt, "copies": len(hws), "empty_us": {}}
    err = res["errors"]
    try:
        w_bf16 = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(2)]
        row["cublas_bf16_us"] = graph_us([lambda w=w_bf16[i % 2], x=x: F.linear(x, w) for i in range(len(hws))])
        del w_bf16
        wt, xt = torch.randn(N, TINY_K, device=dev, dtype=torch.bfloat16), x[:, :TINY_K].contiguous()
        row["cublas_tiny_k_us"] = graph_us([lambda: F.linear(xt, wt) for _ in hws])
    except Exception as e:   # noqa: BLE001
        err.append(f"{fmt} {K}x{N} M {M} cublas: {e!r}"[:400])
    scratch = torch.empty(128, device=dev)
    y_base = None
    for v in RUN:
        r = {}
        if [v.name, fmt] in [list(h) for h in hung]:
            row[v.name] = {"skipped": "its precompile job did not finish in time"}
            continue
        try:
            r["plan"] = gcb.plan_facts(M, N, K, fmt, v, sms)
            grid = tuple(r["plan"]["grid"])
            if str(grid) not in row["empty_us"]:
                row["empty_us"][str(grid)] = graph_us([lambda g=grid: gf.empty(g, scratch) for _ in hws])
            if v is gf.FIN_PDL:
                row["empty_pdl_us"] = graph_us([lambda g=grid: gf.empty(g, scratch, True) for _ in hws])
            out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            kern, _ = gf.full(x, hws[0], v, out)
            torch.cuda.synchronize()
            y = out.clone()
            r["full_kernel"] = gcb._facts(kern)
            r["rel_ref"] = gcb._rel(y, ref)
            r["finite"] = bool(torch.isfinite(y).all())
            if v is gf.BASE:
                y_base = y
            elif y_base is not None and v is not gc.SHIPPED:
                r["bit_equal_n64_k512"] = bool(torch.equal(y, y_base))
            r["ok"] = r["finite"] and r["rel_ref"] < 1e-2
            if v in (gf.FIN, gf.FIN_PDL) and r.get("bit_equal_n64_k512") is False:
                err.append(f"{fmt} {K}x{N} M {M} {v.name}: not bit-equal to n64_k512 (same adds, same order)")
            if r["ok"]:
                r["full_us"] = graph_us([lambda h=h, x=x, v=v, o=out: gf.full(x, h, v, o) for h in hws])
                if "cublas_bf16_us" in row:
                    r["full_speedup"] = row["cublas_bf16_us"] / r["full_us"]
            else:
                err.append(f"{fmt} {K}x{N} M {M} {v.name}: rel_ref {r['rel_ref']:.3g}, finite {r['finite']}: "
                           f"not timed")
            oc = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            kern, _ = gf.compute_only(x, hws[0], v, oc)
            torch.cuda.synchronize()
            r["compute_kernel"] = gcb._facts(kern)
            r["compute_only_us"] = graph_us([lambda h=h, x=x, v=v, o=oc: gf.compute_only(x, h, v, o) for h in hws])
            r["no_k_steps_us"] = graph_us([lambda h=h, x=x, v=v, o=oc: gf.compute_only(x, h, v, o, 0)
                                           for h in hws])
        except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
            err.append(f"{fmt} {K}x{N} M {M} {v.name}: {e!r}"[:400])
        row[v.name] = r
    row["split"] = decompose(row)
    return row


def decompose(row: dict) -> dict:
    """The fixed cost at n64's tiles taken apart (see the module docstring); a missing measurement leaves its key
    out."""
    def nok(name):
        return row.get(name, {}).get("no_k_steps_us")

    def empty(name):
        g = row.get(name, {}).get("plan", {}).get("grid")
        return row["empty_us"].get(str(tuple(g))) if g else None

    out = {}
    if empty("n64_k512") is not None:
        out["launch_floor"] = empty("n64_k512")
    if nok("n64_nosplit") is not None and empty("n64_nosplit") is not None:
        out["setup_and_store"] = nok("n64_nosplit") - empty("n64_nosplit")
    if nok("n64_k512") is not None and nok("n64_nosplit") is not None:
        out["split_k_epilogue"] = nok("n64_k512") - nok("n64_nosplit")
    if nok("n64_k512") is not None and nok("n64_fin") is not None:
        out["fin_saves"] = nok("n64_k512") - nok("n64_fin")
    if nok("n64_fin") is not None and nok("n64_fin_pdl") is not None:
        out["pdl_saves_no_k"] = nok("n64_fin") - nok("n64_fin_pdl")
    full = {n: row.get(n, {}).get("full_us") for n in ("n64_k512", "n64_fin", "n64_fin_pdl")}
    if full["n64_fin"] is not None and full["n64_k512"] is not None:
        out["fin_saves_full"] = full["n64_k512"] - full["n64_fin"]
    if full["n64_fin"] is not None and full["n64_fin_pdl"] is not None:
        out["pdl_saves_full"] = full["n64_fin"] - full["n64_fin_pdl"]
    if nok("n64_nosplit_pdl") is not None:
        out["nosplit_pdl_no_k"] = nok("n64_nosplit_pdl")
    if "empty_pdl_us" in row:
        out["launch_floor_pdl"] = row["empty_pdl_us"]
    if "cublas_tiny_k_us" in row:
        out["cublas_fixed"] = row["cublas_tiny_k_us"]
    return {k: round(v, 3) for k, v in out.items()}


def measure(args) -> None:
    import torch
    from kernel_baselines import graph_us, json_saver, run_env, weight_copies

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.hopper_fp4 import dequantize
    from trace_rl.kernels.linear import hopper_weight

    start = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    hung = []
    if not args.no_precompile:
        t0 = time.time()
        jobs = [(v.name, fmt, M, mode) for v in RUN for fmt in FMTS for M in MS for mode in ("full", "compute")]
        try:
            res["precompile_errors"], hung = gcb.precompile(jobs=jobs, job_fn=_compile_job, timeout_s=55.0)
        except Exception as e:   # noqa: BLE001 -- compiling in the timed loop instead is slower, not wrong
            res["precompile_errors"] = [repr(e)[:300]]
        res["precompile_s"] = round(time.time() - t0, 1)
        res["precompile_hung"] = hung
        save()
    for fmt in FMTS:
        for K, N in SHAPES:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"K": K, "N": N, "fmt": fmt})
                continue
            torch.manual_seed(0)
            n_copies = weight_copies(N * K // 2)
            hws = []
            for _ in range(n_copies):
                w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                hws.append(hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt))))
                del w
            w_ref = dequantize(hws[0])
            for M in MS:
                x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
                row = _row(res, fmt, K, N, M, x, hws, w_ref, sms, hung, graph_us)
                res["rows"].append(row)
                save()
                print({"fmt": fmt, "K": K, "N": N, "M": M, **row["split"],
                       **{v.name: (round(row.get(v.name, {}).get("full_us", -1), 2),
                                   round(row.get(v.name, {}).get("no_k_steps_us", -1), 2)) for v in RUN}},
                      flush=True)
            del hws, w_ref
            if DEV == "cuda":
                torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


def main() -> int:
    return gcb.main(__doc__, dry, measure)     # the same command line as gemm_compute.py


if __name__ == "__main__":
    sys.exit(main())
