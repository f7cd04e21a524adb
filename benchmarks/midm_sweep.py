"""The mid-M Gluon path of `fp4_linear` (issue 15: W4A16 >= 1.6x cuBLAS BF16 at M = 64) against the Triton path it
replaces and cuBLAS BF16, in one run, and the gemm_dispatch.GLUON_MID_M table the measurements give.

    python benchmarks/midm_sweep.py --out midm.json [--budget-s 60]     # an sm_90 GPU, Triton 3.6
    python benchmarks/midm_sweep.py --precompile-only                   # fill Triton's cache (worker processes)

Qwen3-8B's dense linears, K x N (x [M, K] @ W^T, W [N, K]): 4096 x 12288 (gate or up), 12288 x 4096 (down),
4096 x 6144 (q|k|v), 4096 x 4096 (o), 4096 x 24576 (gate|up stacked), 4096 x 1024 (k or v); nvfp4 and mxfp4;
M = 17, 24, 32, 48, 64 on every shape first, then 96 and 128 as the budget allows (a point where
fp4_dequant.use_dequant_cublas takes the linear whatever the table says is recorded as such, not timed). Per point,
microseconds per call through the shipped `fp4_linear` (one CUDA graph of calls over weight copies beyond L2, median
of 15 replays, kernel_baselines.graph_us; inside the capture the Gluon GEMM is a PDL launch, as in the engine):
- `w4a16_gluon` / `w4a4_gluon`: GLUON_MID_M listing this weight up to MID_M_LIMIT (the Gluon GEMM at mid_m_config);
  W4A4 is the activation quantize launch + the GEMM (`fp4_linear(x, w, fmt)`);
- `w4a16_triton` / `w4a4_triton`: the table empty (the Triton fp4_matmul: today's path);
- `cublas_bf16`: F.linear on bf16 weight copies.
Before timing, the Gluon outputs against the Triton path's (relative Frobenius < 1e-2 and finite, else not timed) and
the dispatch's answer under each table (`gluon` must say "gluon"). 2 rounds per point, the variants in reverse order in
the second. The JSON is rewritten after every point; past `--budget-s` no new point starts ("skipped").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(4096, 12288), (12288, 4096), (4096, 6144), (4096, 4096), (4096, 24576), (4096, 1024)]   # K x N
MS_FIRST = [17, 24, 32, 48, 64]
MS_LATER = [96, 128]
FMTS = ["nvfp4", "mxfp4"]
ROUNDS = 2
TARGET_M64 = 1.6          # issue 15: W4A16 at M = 64 >= 1.6x cuBLAS BF16
DEV = "cuda"


@contextlib.contextmanager
def mid_m_table(fmt: str | None, padded: tuple[int, int] | None):
    """gemm_dispatch.GLUON_MID_M listing only `padded` (N, K) of `fmt` up to MID_M_LIMIT, or empty (fmt None); graph
    capture runs the calls inside, so the choice is baked into the graph."""
    from trace_rl.kernels import gemm_dispatch

    old = gemm_dispatch.GLUON_MID_M
    table = {"nvfp4": {}, "mxfp4": {}}
    if fmt is not None:
        table[fmt][tuple(padded)] = gemm_dispatch.MID_M_LIMIT
    gemm_dispatch.GLUON_MID_M = table
    try:
        yield
    finally:
        gemm_dispatch.GLUON_MID_M = old


def _padded(p) -> tuple[int, int]:
    from trace_rl.kernels.hopper_fp4 import padded_shape

    return padded_shape(p.out_features, p.in_features)


def _dequant_takes(M: int, K: int, N: int) -> bool:
    from trace_rl.kernels.fp4_dequant import use_dequant_cublas

    return use_dequant_cublas(M, N, K)


def _compile_job(job: tuple) -> str:
    """Worker (spawn): one (format, K, N, M) point's linears, both tables, W4A16 and W4A4, eagerly and captured in a
    graph (the PDL launch is another compile), to fill Triton's cache."""
    fmt, K, N, M = job
    try:
        import torch
        from kernel_baselines import fp4_weights

        from trace_rl.kernels.linear import fp4_linear

        (p, ) = fp4_weights(fmt, N, K, 1)
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        for table in (fmt, None):
            with mid_m_table(table, _padded(p)):
                for act in ("bf16", fmt):
                    fp4_linear(x, p, act)
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fp4_linear(x, p, act)
                    del g
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(timeout_s: float = 40.0):
    """Every point's launches in 10 worker processes (the check runs its GPU-test shards, compiling too, at the same
    time on the machine's 16 cores), in the sweep's order: a precompile cut by its timeout has compiled the first."""
    import gemm_compute as gcb

    jobs = [(fmt, K, N, M) for _, K, N, fmt, ms in _order() for M in ms if not _dequant_takes(M, K, N)]
    return gcb.precompile(workers=10, jobs=jobs, job_fn=_compile_job, timeout_s=timeout_s)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _point(fmt, K, N, M, ps, w_bf16, graph_us, errors) -> dict:
    """One (format, shape, M) point: the dispatch's answers, the outputs, then ROUNDS rounds of timing."""
    import torch
    import torch.nn.functional as F
    from kernel_baselines import interleaved_rounds, round_stats

    from trace_rl.kernels.linear import fp4_linear, small_m_gemm

    padded = _padded(ps[0])
    row = {"fmt": fmt, "K": K, "N": N, "M": M, "padded": list(padded), "copies": len(ps)}
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    with mid_m_table(fmt, padded):
        row["path_listed"] = small_m_gemm(M, x.device, ps[0])
    with mid_m_table(None, None):
        row["path_empty"] = small_m_gemm(M, x.device, ps[0])
    if row["path_listed"] != "gluon" or row["path_empty"] != "triton":
        errors.append(f"{fmt} {K}x{N} M {M}: dispatch says {row['path_listed']} listed / {row['path_empty']} "
                      f"empty (want gluon / triton): not timed")
        return row
    calls = {}
    for act, name in (("bf16", "w4a16"), (fmt, "w4a4")):
        with mid_m_table(fmt, padded):
            y = fp4_linear(x, ps[0], act)
        with mid_m_table(None, None):
            y_t = fp4_linear(x, ps[0], act)
        torch.cuda.synchronize()
        row[f"{name}_rel_vs_triton"] = rel = _rel(y, y_t)
        if not (bool(torch.isfinite(y).all()) and rel < 1e-2):
            errors.append(f"{fmt} {K}x{N} M {M} {name}: Gluon vs Triton rel {rel:.3g}: not timed")
            continue
        calls[f"{name}_gluon"] = (fmt, lambda act=act: [lambda p=p: fp4_linear(x, p, act) for p in ps])
        calls[f"{name}_triton"] = (None, lambda act=act: [lambda p=p: fp4_linear(x, p, act) for p in ps])
    bf = [w_bf16[i % len(w_bf16)] for i in range(len(ps))]
    calls["cublas_bf16"] = (None, lambda: [lambda w=w: F.linear(x, w) for w in bf])

    def time_one(n):
        table, make = calls[n]
        with mid_m_table(table, padded):
            return graph_us(make())

    row.update(round_stats(interleaved_rounds(calls, time_one, ROUNDS, errors, f"{fmt} {K}x{N} M {M}")))
    cub = row["us"].get("cublas_bf16")
    for act in ("w4a16", "w4a4"):
        g, t = f"{act}_gluon", f"{act}_triton"
        if g in row["us"] and t in row["us"]:
            row[f"{act}_gluon_vs_triton"] = round(row["us"][t] / row["us"][g], 3)     # > 1: Gluon faster
            row[f"{act}_gluon_wins_every_round"] = all(a < b for a, b in zip(row["rounds_us"][g],
                                                                             row["rounds_us"][t]))
        for v in (g, t):
            if cub and v in row["us"]:
                row[f"{v}_x_cublas"] = round(cub / row["us"][v], 3)
    return row


def _order() -> list[tuple]:
    """(pass, K, N, fmt, Ms): M = 17..64 on every shape and format first, then 96 / 128."""
    return [(i, K, N, fmt, ms) for i, ms in enumerate((MS_FIRST, MS_LATER)) for K, N in SHAPES for fmt in FMTS]


def measure(args) -> None:
    import torch
    from kernel_baselines import fp4_weights, graph_us, json_saver, run_env, weight_copies

    start = time.time()
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=torch.cuda.get_device_properties(0).multi_processor_count),
           "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    save()
    for _, K, N, fmt, ms in _order():
        todo = [M for M in ms if not _dequant_takes(M, K, N)]
        for M in set(ms) - set(todo):
            res["rows"].append({"fmt": fmt, "K": K, "N": N, "M": M, "dequant_cublas": True})
        if not todo:
            continue
        if time.time() - start > args.budget_s:
            res["skipped"] += [{"fmt": fmt, "K": K, "N": N, "M": M} for M in todo]
            continue
        try:
            torch.manual_seed(0)
            ps = fp4_weights(fmt, N, K, weight_copies(N * K // 2))
            w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                      for _ in range(weight_copies(N * K * 2))]
        except Exception as e:   # noqa: BLE001
            res["errors"].append(f"{fmt} {K}x{N} weights: {e!r}"[:400])
            continue
        for M in todo:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"fmt": fmt, "K": K, "N": N, "M": M})
                continue
            try:
                row = _point(fmt, K, N, M, ps, w_bf16, graph_us, res["errors"])
            except Exception as e:   # noqa: BLE001 -- one failing point must not lose the others
                res["errors"].append(f"{fmt} {K}x{N} M {M}: {e!r}"[:400])
                continue
            res["rows"].append(row)
            save()
            print({k: row.get(k) for k in ("fmt", "K", "N", "M", "w4a16_gluon_vs_triton", "w4a4_gluon_vs_triton",
                                           "w4a16_gluon_x_cublas")}, flush=True)
        del ps, w_bf16
        torch.cuda.empty_cache()
    res["total_s"] = round(time.time() - start, 1)
    save()


def _wins(r: dict) -> bool:
    """Gluon beat the Triton path in every round at W4A16 and at W4A4 (the table applies to both)."""
    return all(r.get(f"{a}_gluon_wins_every_round") for a in ("w4a16", "w4a4"))


def rule_proposal(rows: list[dict]) -> dict:
    """Per format and padded (N, K): the largest measured M up to which the Gluon path won every round at W4A16 and
    W4A4, scanning M upward from 17 and stopping at the first M it lost or that was not measured (a dequant-cuBLAS
    point is neither: the table does not decide it); no entry where it lost at M = 17. `GLUON_MID_M`: the line to
    paste into trace_rl/kernels/gemm_dispatch.py."""
    out, table = {}, {f: {} for f in FMTS}
    for fmt in FMTS:
        for K, N in SHAPES:
            pts = {r["M"]: r for r in rows if r["fmt"] == fmt and r["K"] == K and r["N"] == N}
            if not pts:
                continue
            padded = next((tuple(r["padded"]) for r in pts.values() if "padded" in r), None)
            best, why = None, "not measured"
            for M in MS_FIRST + MS_LATER:
                r = pts.get(M)
                if r is not None and r.get("dequant_cublas"):
                    continue
                if r is None or "us" not in r:
                    why = f"M = {M} not measured"
                    break
                if not _wins(r):
                    why = (f"lost at M = {M} (W4A16 {r.get('w4a16_gluon_vs_triton')}x, W4A4 "
                           f"{r.get('w4a4_gluon_vs_triton')}x the Triton path's speed)")
                    break
                best, why = M, "won every measured M"
            out[f"{fmt} {K}x{N}"] = {"padded_n_k": padded, "max_m": best, "why": why}
            if best is not None and padded is not None:
                table[fmt][padded] = best
    body = ", ".join(f'"{f}": {{' + ", ".join(f"({n}, {k}): {m}" for (n, k), m in table[f].items()) + "}"
                     for f in FMTS)
    out["GLUON_MID_M"] = "GLUON_MID_M: dict[str, dict[tuple[int, int], int]] = {" + body + "}"
    out["table"] = {f: {f"{n}x{k}": m for (n, k), m in table[f].items()} for f in FMTS}
    return out


def issue15_m64(rows: list[dict]) -> dict:
    """Per shape and format at M = 64: W4A16 (and W4A4) Gluon / Triton as x cuBLAS BF16, against issue 15's 1.6x."""
    out = {}
    for r in rows:
        if r.get("M") != 64 or "us" not in r:
            continue
        g = r.get("w4a16_gluon_x_cublas")
        out[f"{r['fmt']} {r['K']}x{r['N']}"] = {
            "w4a16_gluon_x_cublas": g, "w4a16_triton_x_cublas": r.get("w4a16_triton_x_cublas"),
            "w4a4_gluon_x_cublas": r.get("w4a4_gluon_x_cublas"), "w4a4_triton_x_cublas": r.get("w4a4_triton_x_cublas"),
            "target": TARGET_M64, "meets_target": bool(g and g >= TARGET_M64)}
    return out


def summarize(res: dict) -> dict:
    """The check's summary.json body: the rule to paste, issue 15's M = 64 ratios, one line per point, errors."""
    rows = res.get("rows", [])
    timed = [r for r in rows if "us" in r]
    s = {"rule_proposal": rule_proposal(rows), "issue15_m64": issue15_m64(rows),
         "points": {"timed": len(timed), "dequant_cublas": sum(1 for r in rows if r.get("dequant_cublas")),
                    "skipped": len(res.get("skipped", []))},
         "total_s": res.get("total_s"), "errors": res.get("errors", [])[:10], "skipped": res.get("skipped", [])[:20]}
    s["table"] = [f"{r['fmt']} {r['K']}x{r['N']} M={r['M']}: W4A16 gluon {r['us'].get('w4a16_gluon')} / triton "
                  f"{r['us'].get('w4a16_triton')} / cuBLAS {r['us'].get('cublas_bf16')} us "
                  f"(gluon {r.get('w4a16_gluon_x_cublas')}x cuBLAS, {r.get('w4a16_gluon_vs_triton')}x triton, every "
                  f"round: {r.get('w4a16_gluon_wins_every_round')}); W4A4 gluon {r['us'].get('w4a4_gluon')} / triton "
                  f"{r['us'].get('w4a4_triton')} us ({r.get('w4a4_gluon_vs_triton')}x triton, every round: "
                  f"{r.get('w4a4_gluon_wins_every_round')})" for r in timed]
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="midm.json")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new point after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    args = ap.parse_args()
    if args.precompile_only:
        import gemm_compute as gcb

        return gcb.precompile_exit(lambda: precompile(args.precompile_timeout_s))
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
