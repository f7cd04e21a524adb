"""The SHIPPED small-M FP4 linear (issue 15: `fp4_linear` at M <= 16 takes the Gluon GEMM, fp4_gemm_gluon.SMALL_M with
programmatic dependent launch) against cuBLAS BF16, the previous Triton path and gemlite, all in one run.

    python benchmarks/gemm_ship.py --out gemm_ship.json [--budget-s 40]     # an sm_90 GPU, Triton 3.6
    python benchmarks/gemm_ship.py --precompile-only                        # fill Triton's cache (8 processes)

Per K x N (4096x12288, 12288x4096, 4096x1024), M (1, 4, 16) and format (nvfp4, mxfp4), microseconds per call (one
CUDA graph of calls over weight copies larger than L2, median of 15 replays after 3 warm-up: benchmarks/gemm_gluon.py's
timing), each measured in this run:
- `cublas_bf16`: F.linear on bf16 weights;
- `w4a16` / `w4a16_triton`: `fp4_linear(x, w)` as shipped (the dispatch's Gluon GEMM) and with
  gemm_dispatch.GLUON_SMALL_M off (the Triton `fp4_matmul` at its default config: the previous path);
- `w4a4` / `w4a4_triton`: `fp4_linear(x, w, act_fmt=fmt)`: the activation quantize launch + the GEMM (shipped: the
  quantize kernel launches dependents, the GEMM is a PDL launch);
- `prequant` / `prequant_triton`: `fp4_linear_prequantized` (activations quantized once outside the graph);
- `gemlite_int4`: gemlite's A16W4 INT4 (group 64) layer (GEMLITE_SRC), where importable;
- `after_norm_*`: each GEMM preceded by an RMSNorm over its [M, K] input (a non-PDL kernel, as in a model), for
  cuBLAS, the shipped W4A16 and the Triton path, and `rmsnorm_alone`;
- `bytes` read per call (FP4 weight + scales + row factors + x + out), `read_ceiling_TBps` (a measured read-only
  pass) and per FP4 variant `bw_fraction` = bytes / us / ceiling;
- speedups: cuBLAS us / us for every variant, shipped vs Triton, vs gemlite, and `w4a4_over_w4a16` (the issue asks
  W4A4 within 15% of W4A16).
Outputs are checked first: shipped vs the Triton path (relative Frobenius difference < 1e-2, else not timed). The
JSON is rewritten after every row; past `--budget-s` no new row starts ("skipped").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(4096, 12288), (12288, 4096), (4096, 1024)]      # (K, N)
MS = [1, 4, 16]
FMTS = ["nvfp4", "mxfp4"]
DEV = "cuda"


@contextlib.contextmanager
def gluon_small_m(on: bool):
    """gemm_dispatch.GLUON_SMALL_M set to `on` (graph capture runs the calls inside: the switch is baked in)."""
    from trace_rl.kernels import gemm_dispatch

    old = gemm_dispatch.GLUON_SMALL_M
    gemm_dispatch.GLUON_SMALL_M = on
    try:
        yield
    finally:
        gemm_dispatch.GLUON_SMALL_M = old


def fp4_bytes(N: int, K: int, M: int, fmt: str) -> int:
    """Bytes a call reads and writes: codes N K / 2, scales (a byte per 16 / 32), row factors, x and out in bf16."""
    return N * K // 2 + N * K // (16 if fmt == "nvfp4" else 32) + 4 * N + 2 * M * K + 2 * M * N


def _compile_job(job: tuple) -> str:
    """Worker (spawn): every launch of one (format, K, N, M) row, shipped and Triton, to fill Triton's cache."""
    fmt, K, N, M = job
    try:
        import torch
        from kernel_baselines import fp4_weights

        from trace_rl.formats import per_token
        from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized
        from trace_rl.kernels.rmsnorm import add_rms_norm
        from trace_rl.kernels.row_quantize import quantize_dequant_bf16

        (p, ) = fp4_weights(fmt, N, K, 1)
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        xq, rs = quantize_dequant_bf16(x, per_token(fmt))
        add_rms_norm(x, None, torch.ones(K, device=DEV, dtype=torch.bfloat16), 1e-6)
        for on in (True, False):
            with gluon_small_m(on):
                fp4_linear(x, p)
                fp4_linear(x, p, fmt)
                fp4_linear_prequantized(xq, rs, p)
        if fmt == FMTS[0]:          # gemlite's kernels for this M (one format's job compiles them)
            from kernel_baselines import gemlite_available, gemlite_int4_linear

            if gemlite_available()[0]:
                gemlite_int4_linear(torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02)(x)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def _parse_shapes(text: str | None) -> list[tuple[int, int]]:
    """--shapes "12288x4096,4096x1024" (K x N, a subset of SHAPES); None: all of SHAPES."""
    if not text:
        return list(SHAPES)
    shapes = [tuple(int(d) for d in part.split("x")) for part in text.split(",")]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise SystemExit(f"--shapes: {bad} not among {SHAPES} (K x N)")
    return shapes


def precompile(timeout_s: float = 40.0, shapes=None):
    import gemm_compute as gcb

    jobs = [(fmt, K, N, M) for fmt in FMTS for K, N in (shapes or SHAPES) for M in MS]
    # 8 workers: the check runs its 8 GPU-test shards (compiling too) at the same time on the machine's 16 cores
    return gcb.precompile(workers=8, jobs=jobs, job_fn=_compile_job, timeout_s=timeout_s)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _row(fmt, K, N, M, ps, w_bf16, gl_layers, gl_reason, ceiling, graph_us, errors):
    import torch
    import torch.nn.functional as F

    from trace_rl.formats import per_token
    from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized
    from trace_rl.kernels.rmsnorm import add_rms_norm
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    row = {"fmt": fmt, "K": K, "N": N, "M": M, "copies": len(ps), "bytes": fp4_bytes(N, K, M, fmt)}
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    xq, rs = quantize_dequant_bf16(x, per_token(fmt))
    norm_w = torch.ones(K, device=DEV, dtype=torch.bfloat16)

    def norm(t):
        return add_rms_norm(t, None, norm_w, 1e-6)[0]

    def timed(name, calls, on=True):
        try:
            with gluon_small_m(on):
                row[f"{name}_us"] = graph_us(calls)
        except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the row
            errors.append(f"{fmt} {K}x{N} M {M} {name}: {e!r}"[:400])

    ok = {}
    for act, name in (("bf16", "w4a16"), (fmt, "w4a4")):
        with gluon_small_m(True):
            y = fp4_linear(x, ps[0], act)
        with gluon_small_m(False):
            y_t = fp4_linear(x, ps[0], act)
        torch.cuda.synchronize()
        row[f"{name}_rel_vs_triton"] = _rel(y, y_t)
        ok[name] = bool(torch.isfinite(y).all()) and row[f"{name}_rel_vs_triton"] < 1e-2
        if not ok[name]:
            errors.append(f"{fmt} {K}x{N} M {M} {name}: rel vs Triton {row[f'{name}_rel_vs_triton']:.3g}: not timed")
    bf16_cycle = [w_bf16[i % len(w_bf16)] for i in range(len(ps))]
    timed("cublas_bf16", [lambda w=w: F.linear(x, w) for w in bf16_cycle])
    for on, sfx in ((True, ""), (False, "_triton")):
        if ok["w4a16"]:
            timed(f"w4a16{sfx}", [lambda p=p: fp4_linear(x, p) for p in ps], on)
            timed(f"after_norm_w4a16{sfx}", [lambda p=p: fp4_linear(norm(x), p) for p in ps], on)
        if ok["w4a4"]:
            timed(f"w4a4{sfx}", [lambda p=p: fp4_linear(x, p, fmt) for p in ps], on)
            timed(f"prequant{sfx}", [lambda p=p: fp4_linear_prequantized(xq, rs, p) for p in ps], on)
    timed("after_norm_cublas_bf16", [lambda w=w: F.linear(norm(x), w) for w in bf16_cycle])
    timed("rmsnorm_alone", [lambda: norm(x) for _ in ps])
    if gl_layers:
        timed("gemlite_int4", [lambda g=g: g(x) for g in gl_layers])
    else:
        row["gemlite_int4"] = gl_reason
    cub = row.get("cublas_bf16_us")
    sp = {}
    for k in [k for k in row if k.endswith("_us")]:
        name = k[:-3]
        if cub and not name.startswith(("after_norm", "rmsnorm", "cublas")):
            sp[name] = round(cub / row[k], 3)
        if name.startswith(("w4a", "prequant")) and ceiling:
            row[f"{name}_bw_fraction"] = round(row["bytes"] / (row[k] * 1e-6) / (ceiling * 1e12), 3)
    if row.get("after_norm_cublas_bf16_us"):
        for name in ("after_norm_w4a16", "after_norm_w4a16_triton"):
            if f"{name}_us" in row:
                sp[name] = round(row["after_norm_cublas_bf16_us"] / row[f"{name}_us"], 3)
    for a, b in (("w4a16", "w4a16_triton"), ("w4a4", "w4a4_triton"), ("prequant", "prequant_triton"),
                 ("after_norm_w4a16", "after_norm_w4a16_triton"), ("w4a16", "gemlite_int4")):
        if f"{a}_us" in row and f"{b}_us" in row:
            sp[f"{a}_vs_{b}"] = round(row[f"{b}_us"] / row[f"{a}_us"], 3)
    if "w4a4_us" in row and "w4a16_us" in row:
        row["w4a4_over_w4a16"] = round(row["w4a4_us"] / row["w4a16_us"], 3)
        row["prequant_over_w4a16"] = round(row.get("prequant_us", float("nan")) / row["w4a16_us"], 3)
    row["speedup"] = sp
    return row


def measure(args) -> None:
    import torch
    from kernel_baselines import (
        ceilings,
        fp4_weights,
        gemlite_available,
        gemlite_int4_linear,
        graph_us,
        json_saver,
        run_env,
        weight_copies,
    )

    start = time.time()
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=torch.cuda.get_device_properties(0).multi_processor_count),
           "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    try:
        res["ceilings"] = ceilings()
    except Exception as e:   # noqa: BLE001
        res["errors"].append(f"ceilings: {e!r}"[:300])
    ceiling = res.get("ceilings", {}).get("read_TBps")
    gl_ok, gl_info = gemlite_available()
    res["gemlite"] = gl_info if gl_ok else {"unavailable": gl_info}
    save()
    for K, N in _parse_shapes(args.shapes):
        if time.time() - start > args.budget_s:
            res["skipped"] += [{"K": K, "N": N, "M": M, "fmt": f} for f in FMTS for M in MS]
            continue
        torch.manual_seed(0)
        n = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                  for _ in range(weight_copies(N * K * 2))]
        gl_layers, gl_reason = [], gl_info
        if gl_ok:
            try:
                gl_layers = [gemlite_int4_linear(w_bf16[i % len(w_bf16)]) for i in range(n)]
            except Exception as e:   # noqa: BLE001
                gl_reason = f"gemlite layer failed: {e!r}"[:300]
        for fmt in FMTS:
            if time.time() - start > args.budget_s:
                res["skipped"] += [{"K": K, "N": N, "M": M, "fmt": fmt} for M in MS]
                continue
            ps = fp4_weights(fmt, N, K, n)
            for M in MS:
                if time.time() - start > args.budget_s:
                    res["skipped"].append({"K": K, "N": N, "M": M, "fmt": fmt})
                    continue
                row = _row(fmt, K, N, M, ps, w_bf16, gl_layers, gl_reason, ceiling, graph_us, res["errors"])
                res["rows"].append(row)
                save()
                print({k: row[k] for k in ("fmt", "K", "N", "M")}, row["speedup"], flush=True)
            del ps
        del w_bf16, gl_layers
        torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gemm_ship.json")
    ap.add_argument("--budget-s", type=float, default=40.0, help="start no new row after this many seconds")
    ap.add_argument("--shapes", default=None, help='K x N pairs to run, e.g. "12288x4096,4096x1024" (default: all)')
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    args = ap.parse_args()
    if args.precompile_only:
        import gemm_compute as gcb

        return gcb.precompile_exit(lambda: precompile(args.precompile_timeout_s, _parse_shapes(args.shapes)))
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
