"""Small-weight Gluon FP4 GEMM configs at M <= 16 (issue 15, "ahead of gemlite at every M": 4096x1024 at M = 1 is the
one point gemlite wins, 5.0-5.4 us against 5.4-5.7) against the shipped config, cuBLAS BF16 and gemlite, in one run.

    python benchmarks/smallm_sweep.py --out smallm.json [--budget-s 60]     # an sm_90 GPU, Triton 3.6
    python benchmarks/smallm_sweep.py --precompile-only                     # fill Triton's cache (worker processes)

At K x N = 4096 x 1024 (x [M, 4096] @ W^T, W [1024, 4096]), M = 1 / 4 / 16, nvfp4 and mxfp4, W4A16 (bf16 x) and
W4A4 prequantized (x = code x block scale from `quantize_dequant_bf16`, nvfp4 with its per-token row scale: the
`fp4_linear_prequantized` launch), every variant launched as the shipped path launches it inside a graph
(`fp4_matmul_gluon(..., pdl=True)`):
- `shipped`: config None (`config_for`: SMALL_M at its auto split, unless SMALL_GRID names one);
- each of fp4_gemm_gluon_config.SMALL_GRID_CANDIDATES for the format (explicit split; see there);
- `cublas_bf16` (F.linear on bf16 weight copies) and `gemlite_int4` (gemlite's A16W4 INT4, group 64, H100 configs;
  W4A16 rows only; from GEMLITE_SRC / .gpu/gemlite_src, or its reason when absent).
Before timing, per point: each variant's output against the float64 reference (relative Frobenius < 1e-2 and finite,
else not timed), `bit_identical_vs_shipped` (only candidates with the shipped K partition can be), the largest
difference otherwise, and (W4A16) `bit_identical_vs_nofin`: the same config on `_fp4_gemm_ws_kernel` (fin=False) at
the same split, the project's bit-exactness rule for a new split.
Timing: microseconds per call, one CUDA graph of calls over weight copies beyond L2, median of 15 replays
(kernel_baselines.graph_us), ROUNDS rounds per point, the variants in reverse order in the second round; a variant's
`us` is the mean of its round medians, `rounds_us` lists them. The JSON is rewritten after every point; past
`--budget-s` no new point starts ("skipped"). No torchrl: torch, triton, trace_rl's kernels and gemlite only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

K, N = 4096, 1024
MS = [1, 4, 16]
FMTS = ["nvfp4", "mxfp4"]
ACTS = ["w4a16", "prequant"]
ROUNDS = 2
DEV = "cuda"


def variants(fmt: str) -> dict:
    """name -> GluonConfig (None: the launcher's own choice) for `fmt`."""
    from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_GRID_CANDIDATES

    return {"shipped": None, **{n: c for n, (c, fmts) in SMALL_GRID_CANDIDATES.items() if fmt in fmts}}


def _weights(fmt: str, n: int, seed: int = 0) -> tuple[list, list]:
    """`n` random [N, K] weights: (PackedWeights, their Hopper layouts), the layouts derived now (never inside a
    capture)."""
    import torch

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.linear import hopper_weight

    g = torch.Generator(device=DEV).manual_seed(seed)
    ps = []
    for _ in range(n):
        w = torch.randn(N, K, device=DEV, generator=g, dtype=torch.float32).to(torch.bfloat16) * 0.02
        ps.append(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
    return ps, [hopper_weight(p) for p in ps]


def _inputs(fmt: str, M: int, seed: int):
    """(x bf16 [M, K], xq prequantized, row scale or None)."""
    import torch

    from trace_rl.formats import per_token
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.float32).to(torch.bfloat16)
    xq, rs = quantize_dequant_bf16(x, per_token(fmt))
    return x, xq, rs


def _call(inp, h, cfg, rs):
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    return fp4_matmul_gluon(inp, h, cfg, row_scale=rs, pdl=True)


def _compile_job(job: tuple) -> str:
    """Worker (spawn): every launch of one (format, variant) at every M and act (+ the fin=False check launch), or
    gemlite's kernels at every M (`("gemlite", ...)`), to fill Triton's cache."""
    fmt, name = job
    try:
        import torch

        if fmt == "gemlite":
            from kernel_baselines import gemlite_available, gemlite_int4_linear

            ok, why = gemlite_available()
            if not ok:
                return ""
            layer = gemlite_int4_linear(torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02)
            for M in MS:
                layer(torch.randn(M, K, device=DEV, dtype=torch.bfloat16))
            torch.cuda.synchronize()
            return ""
        from trace_rl.kernels.fp4_gemm_gluon import config_for, fp4_matmul_gluon

        (_, ), (h, ) = _weights(fmt, 1)
        cfg = variants(fmt)[name]
        for M in MS:
            x, xq, rs = _inputs(fmt, M, 1)
            _call(x, h, cfg, None)
            _call(xq, h, cfg, rs)
            fp4_matmul_gluon(x, h, replace(cfg or config_for(M, fmt, h.padded[1], h.padded[0]), fin=False))
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(timeout_s: float = 40.0, workers: int = 12) -> tuple[list[str], list[tuple]]:
    """Every job of `_compile_job` in `workers` spawned processes; a job still running after `timeout_s` (a kernel
    that never finishes would hang the run) has its workers killed. Returns (errors, hung jobs)."""
    from concurrent.futures import ProcessPoolExecutor, wait
    from multiprocessing import get_context

    jobs = [("gemlite", "")] + [(fmt, name) for fmt in FMTS for name in variants(fmt)]
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"))
    futs = {pool.submit(_compile_job, j): j for j in jobs}
    done, pending = wait(futs, timeout=timeout_s)
    errors = [e for e in (f.result() for f in done) if e]
    if pending:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return errors, sorted(futs[f] for f in pending)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _launch_facts(M: int, fmt: str, padded: tuple[int, int], cfg, sms: int) -> dict:
    """The launch's config, token tile, K step, split and program count on `sms` SMs, as fp4_matmul_gluon computes
    them (fp4_gemm_gluon_config + the launcher's grid rule, importable without a GPU)."""
    import triton

    from trace_rl.kernels.fp4_gemm_gluon_config import auto_split, config_for

    c = cfg or config_for(M, fmt, padded[1], padded[0])
    bm, bk = c.tile_m(M), c.bk(fmt)
    # = fp4_gemm_gluon.launch_grid (that module needs Triton 3.6's Gluon; --dry runs anywhere)
    n_tiles, m_tiles, kb = triton.cdiv(padded[0], c.block_n), triton.cdiv(M, bm), padded[1] // bk
    split = c.split_k or auto_split(n_tiles * m_tiles, kb, sms * c.ctas_per_sm(bm, fmt))
    split = triton.cdiv(kb, triton.cdiv(kb, max(1, min(split, kb))))
    return {"config": asdict(c), "block_m": bm, "block_k": bk, "split": split, "programs": n_tiles * m_tiles * split,
            "k_steps_per_program": -(-kb // split), "columns_per_program": -(-kb // split) * bk}


def _point(fmt, M, act, ps, hs, w_bf16, gl_layers, gl_reason, graph_us, errors) -> dict:
    """One (format, M, act) point: checks, then ROUNDS rounds of timing."""
    import torch
    import torch.nn.functional as F

    from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, fp4_matmul_gluon, launch_grid

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, xq, rs = _inputs(fmt, M, 1000 + M)
    inp, rs = (x, None) if act == "w4a16" else (xq, rs)
    ref = inp.double() @ ps[0].q.dequantize().double().T
    if rs is not None:
        ref = ref * rs.double()[:, None]
    row = {"fmt": fmt, "K": K, "N": N, "M": M, "act": act, "variants": {}}
    outs = {}
    for name, cfg in variants(fmt).items():
        v = row["variants"][name] = {}
        try:
            v.update(_launch_facts(M, fmt, hs[0].padded, cfg, sms))
            used = GluonConfig(**v["config"])
            split = launch_grid(M, hs[0].padded, used, v["block_m"], v["block_k"],
                                lambda u=used, bm=v["block_m"]: sms * u.ctas_per_sm(bm, fmt))[3]
            if split != v["split"]:
                raise AssertionError(f"launch facts: split {v['split']}, fp4_gemm_gluon.launch_grid {split}")
            y = _call(inp, hs[0], cfg, rs)
            torch.cuda.synchronize()
            v["rel_vs_ref"] = _rel(y, ref)
            v["ok"] = bool(torch.isfinite(y).all()) and v["rel_vs_ref"] < 1e-2
            if act == "w4a16":
                prev = fp4_matmul_gluon(inp, hs[0], replace(used, fin=False, split_k=v["split"]))
                v["bit_identical_vs_nofin"] = bool(torch.equal(y, prev))
            outs[name] = y
        except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the point
            v["ok"] = False
            errors.append(f"{fmt} M {M} {act} {name}: {e!r}"[:400])
    base = outs.get("shipped")
    for name, y in outs.items():
        if base is not None:
            v = row["variants"][name]
            v["bit_identical_vs_shipped"] = bool(torch.equal(y, base))
            d = (y.float() - base.float()).abs()
            v["max_abs_diff_vs_shipped"] = d.max().item()
            v["rel_vs_shipped"] = _rel(y, base)
    timed = {n: (lambda cfg=cfg: [lambda h=h: _call(inp, h, cfg, rs) for h in hs])
             for n, cfg in variants(fmt).items() if row["variants"][n].get("ok")}
    if act == "w4a16":
        bf = [w_bf16[i % len(w_bf16)] for i in range(len(hs))]
        timed["cublas_bf16"] = lambda: [lambda w=w: F.linear(x, w) for w in bf]
        if gl_layers:
            timed["gemlite_int4"] = lambda: [lambda g=g: g(x) for g in gl_layers]
        else:
            row["gemlite_int4"] = gl_reason
    rounds = {n: [] for n in timed}
    for r in range(ROUNDS):
        for n in (list(timed) if r % 2 == 0 else list(reversed(timed))):
            try:
                rounds[n].append(graph_us(timed[n]()))
            except Exception as e:   # noqa: BLE001
                errors.append(f"{fmt} M {M} {act} {n} timing: {e!r}"[:400])
    row["us"] = {n: round(sum(t) / len(t), 3) for n, t in rounds.items() if t}
    row["rounds_us"] = {n: [round(u, 3) for u in t] for n, t in rounds.items() if t}
    fp4 = {n: u for n, u in row["us"].items() if n in row["variants"]}
    if fp4:
        best = min(fp4, key=fp4.get)
        row["best"], row["best_us"] = best, fp4[best]
        sh = fp4.get("shipped")
        if sh:
            row["best_vs_shipped"] = round(sh / fp4[best], 3)     # > 1: the best candidate is faster
            # the best wins both rounds against shipped, not only on the mean
            row["best_wins_every_round"] = all(b < s for b, s in zip(row["rounds_us"][best],
                                                                     row["rounds_us"]["shipped"]))
        for other in ("gemlite_int4", "cublas_bf16"):
            if other in row["us"]:
                row[f"best_vs_{other}"] = round(row["us"][other] / fp4[best], 3)
                if sh:
                    row[f"shipped_vs_{other}"] = round(row["us"][other] / sh, 3)
    return row


def measure(args) -> None:
    import torch
    from kernel_baselines import gemlite_available, gemlite_int4_linear, graph_us, json_saver, run_env, weight_copies

    start = time.time()
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=torch.cuda.get_device_properties(0).multi_processor_count),
           "shape": {"K": K, "N": N}, "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    gl_ok, gl_info = gemlite_available()
    res["gemlite"] = gl_info if gl_ok else {"unavailable": gl_info}
    save()
    torch.manual_seed(0)
    n = weight_copies(N * K // 2)
    w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(weight_copies(N * K * 2))]
    gl_layers, gl_reason = [], (f"gemlite unavailable: {gl_info}" if not gl_ok else "")
    if gl_ok:
        try:
            gl_layers = [gemlite_int4_linear(w_bf16[i % len(w_bf16)]) for i in range(n)]
        except Exception as e:   # noqa: BLE001
            gl_reason = f"gemlite layer failed: {e!r}"[:300]
            res["errors"].append(gl_reason)
    res["weight_copies"] = n
    # M = 1 first for both formats (the point the issue misses), then 4, then 16
    order = [(M, fmt) for M in MS for fmt in FMTS]
    weights = {}
    for M, fmt in order:
        if time.time() - start > args.budget_s:
            res["skipped"] += [{"fmt": fmt, "M": M, "act": a} for a in ACTS]
            continue
        if fmt not in weights:
            weights[fmt] = _weights(fmt, n)
        ps, hs = weights[fmt]
        for act in ACTS:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"fmt": fmt, "M": M, "act": act})
                continue
            row = _point(fmt, M, act, ps, hs, w_bf16, gl_layers, gl_reason, graph_us, res["errors"])
            res["rows"].append(row)
            save()
            print({k: row.get(k) for k in ("fmt", "M", "act", "best", "best_us", "best_vs_shipped")}, row["us"],
                  flush=True)
    res["total_s"] = round(time.time() - start, 1)
    save()


MARGIN = 0.98       # a candidate replaces SMALL_M at a token tile only at <= 98% of its time (mean over the points)
TILE_MS = {8: (1, 4), 16: (16, )}     # SMALL_GRID's keys (largest M covered) and the measured M they cover


def rule_proposal(rows: list[dict]) -> dict:
    """Per format and token tile (SMALL_GRID key 8: M = 1 / 4; 16: M = 16): the candidate with the lowest mean of
    us / shipped us over the tile's measured points (both acts), among candidates measured at all of them, correct
    at all (`ok`) and, where checked, bit-identical to the fin=False launch at their split; it is proposed when that
    mean is <= MARGIN and it beat shipped in every round of every point, else SMALL_M stays ("keep")."""
    out = {}
    for fmt in FMTS:
        per_tile = {}
        for tile, ms in TILE_MS.items():
            pts = [r for r in rows if r["fmt"] == fmt and r["M"] in ms and "shipped" in r.get("us", {})]
            if not pts:
                per_tile[tile] = {"choice": "keep", "why": "not measured"}
                continue
            scores = {}
            for name in pts[0]["variants"]:
                if name == "shipped":
                    continue
                vs = [r["variants"].get(name, {}) for r in pts]
                if not all(v.get("ok") and v.get("bit_identical_vs_nofin", True) for v in vs) or \
                        not all(name in r["us"] for r in pts):
                    continue
                ratio = sum(r["us"][name] / r["us"]["shipped"] for r in pts) / len(pts)
                every = all(c < s for r in pts for c, s in zip(r["rounds_us"][name], r["rounds_us"]["shipped"]))
                scores[name] = (round(ratio, 3), every)
            best = min(scores, key=lambda n: scores[n][0], default=None)
            entry = {"points": len(pts), "scores": {n: r for n, (r, _) in scores.items()}}
            if best is not None and scores[best][0] <= MARGIN and scores[best][1]:
                entry.update(choice=best, time_vs_shipped=scores[best][0],
                             same_bits_as_shipped=all(r["variants"][best].get("bit_identical_vs_shipped")
                                                      for r in pts))
            else:
                entry.update(choice="keep", why=f"no candidate at <= {MARGIN} of shipped in every round"
                             if best else "no candidate passed its checks")
            per_tile[tile] = entry
        out[fmt] = per_tile
    chosen = {fmt: {t: e["choice"] for t, e in tiles.items() if e["choice"] != "keep"} for fmt, tiles in out.items()}
    out["SMALL_GRID"] = "{" + ", ".join(
        f'"{fmt}": {{' + ", ".join(f'{t}: SMALL_GRID_CANDIDATES["{n}"][0]' for t, n in sorted(c.items())) + "}"
        for fmt, c in chosen.items()) + "}"
    return out


def summarize(res: dict) -> dict:
    """The check's summary.json body from the sweep's JSON: per point the us, the best variant and the ratios, every
    variant's checks, and `rule_proposal` (the SMALL_GRID to set, as Python)."""
    s = {"gemlite": res.get("gemlite"), "weight_copies": res.get("weight_copies"), "total_s": res.get("total_s"),
         "errors": res.get("errors", [])[:8], "skipped": res.get("skipped", [])}
    rows = res.get("rows", [])
    s["rule_proposal"] = rule_proposal(rows)
    s["vs_gemlite"] = {f"{r['fmt']} M={r['M']}": {"shipped": r.get("shipped_vs_gemlite_int4"),
                                                  "best": r.get("best_vs_gemlite_int4"), "best_name": r.get("best")}
                       for r in rows if r["act"] == "w4a16" and "gemlite_int4" in r.get("us", {})}
    checks_failed = [f"{r['fmt']} M={r['M']} {r['act']} {n}: " + ", ".join(
        k for k in ("ok", "bit_identical_vs_nofin") if v.get(k) is False)
        for r in rows for n, v in r["variants"].items()
        if v.get("ok") is False or v.get("bit_identical_vs_nofin") is False]
    s["checks_failed"] = checks_failed
    s["rows"] = [{"fmt": r["fmt"], "M": r["M"], "act": r["act"], "us": {k: round(u, 2) for k, u in r["us"].items()},
                  **{k: r[k] for k in ("best", "best_vs_shipped", "best_wins_every_round", "best_vs_gemlite_int4",
                                       "shipped_vs_gemlite_int4", "best_vs_cublas_bf16", "shipped_vs_cublas_bf16")
                     if k in r},
                  "split": {n: v.get("split") for n, v in r["variants"].items()},
                  "bits_vs_shipped": {n: v.get("bit_identical_vs_shipped") for n, v in r["variants"].items()},
                  "max_rel_vs_ref": max((v.get("rel_vs_ref", 0) for v in r["variants"].values()), default=None)}
                 for r in rows]
    return s


def dry(sms: int = 132) -> dict:
    """Per format and M, each variant's launch (config, split, programs, columns per program) on `sms` SMs: no GPU."""
    from trace_rl.kernels.hopper_fp4 import padded_shape

    pad = padded_shape(N, K)
    return {fmt: {M: {n: _launch_facts(M, fmt, pad, c, sms) for n, c in variants(fmt).items()} for M in MS}
            for fmt in FMTS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="smallm.json")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new point after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    ap.add_argument("--dry", action="store_true", help="print each variant's launch on 132 SMs (no GPU) and exit")
    args = ap.parse_args()
    if args.dry:
        import json

        plan = dry()
        with open(args.out, "w") as f:
            json.dump(plan, f, indent=1)
        for fmt, per_m in plan.items():
            for M, vs in per_m.items():
                print(fmt, M, {n: (v["split"], v["programs"], v["columns_per_program"]) for n, v in vs.items()})
        return 0
    if args.precompile_only:
        t0 = time.time()
        errors, hung = precompile(args.precompile_timeout_s)
        print({"precompile_s": round(time.time() - t0, 1), "errors": errors, "hung": hung}, flush=True)
        return 1 if errors or hung else 0
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
