"""Gluon FP4 GEMM configs at M <= 16 (issue 15: the small-weight rule, and >= 2.2x cuBLAS BF16 at the large shapes)
against the shipped config, cuBLAS BF16 and gemlite, in one run, per weight shape.

    python benchmarks/smallm_sweep.py --out smallm.json [--budget-s 60] [--shapes 4096x12288,4096x1024]
    python benchmarks/smallm_sweep.py --precompile-only [--shapes ...]      # fill Triton's cache (worker processes)
    python benchmarks/smallm_sweep.py --dry [--shapes ...]                  # each variant's launch, no GPU

Shapes are K x N (x [M, K] @ W^T, W [N, K]; default 4096x1024, the `smallm` check; `smallwide` adds Qwen3-8B's
4096x12288, 12288x4096, 4096x6144, 4096x4096), in the order given. Per shape, M = 1 / 4 / 16 (SMALLM_MS), nvfp4 and
mxfp4, W4A16 (bf16 x) and W4A4 prequantized (x = code x block scale from `quantize_dequant_bf16`, nvfp4 with its
per-token row scale: the `fp4_linear_prequantized` launch), every variant launched as the shipped path launches it
inside a graph (`fp4_matmul_gluon(..., pdl=True)`):
- `shipped`: config None (`config_for`: SMALL_GRID's config where the rule names one, else SMALL_M at its auto split);
- each of fp4_gemm_gluon_config.SMALL_GRID_CANDIDATES for the format (explicit split), less those making the same
  launch as an earlier variant at the point and those needing more than WAVES waves (`variants`; the row's
  `excluded` says which and why);
- `cublas_bf16` (F.linear on bf16 weight copies, both acts: the issue's baseline) and `gemlite_int4` (gemlite's A16W4
  INT4, group 64; W4A16 rows only; from GEMLITE_SRC / .gpu/gemlite_src, or its reason when absent).
Before timing, per point: each variant's output against the float64 reference (relative Frobenius < 1e-2 and finite,
else not timed), `bit_identical_vs_shipped`, the largest difference otherwise, and (W4A16) `bit_identical_vs_nofin`:
the same config on `_fp4_gemm_ws_kernel` (fin=False) at the same split, the project's bit-exactness rule for a split.
Timing: microseconds per call, one CUDA graph of calls over weight copies beyond L2 (the large shapes read HBM),
median of 15 replays (kernel_baselines.graph_us), ROUNDS rounds per point, the variants in reverse order in the
second round; a variant's `us` is the mean of its round medians, `rounds_us` lists them. The JSON is rewritten after
every point; past `--budget-s` no new point starts ("skipped"). The summary and the rule proposal: smallm_summary.py.
No torchrl: torch, triton, trace_rl's kernels and gemlite only.

Env (read at import, so the precompile's worker processes see the same; a check restricts the sweep with them, e.g.
`m16`): SMALLM_MS, the Ms (comma-separated, each 1..16; default 1,4,16); SMALLM_ROUNDS (default 2); SMALLM_VARIANTS,
the candidates to time besides `shipped` (comma-separated SMALL_GRID_CANDIDATES names; default all); SMALLM_GEMLITE,
0 leaves gemlite out (no layers built, no compile; rows say so; default 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(4096, 1024)]          # (K, N), the `smallm` check's one shape
WIDE_SHAPES = "4096x12288,12288x4096,4096x6144,4096x4096,4096x1024"     # the `smallwide` check: large ones first
FMTS = ["nvfp4", "mxfp4"]
ACTS = ["w4a16", "prequant"]
WAVES = 2           # a candidate needing more than WAVES waves of resident programs at a point is not timed there
DEV = "cuda"


def _env_list(name: str, default: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, default).split(",") if v.strip()]


def _env_ints(name: str, default: str, lo: int, hi: int) -> list[int]:
    try:
        vals = [int(v) for v in _env_list(name, default)]
    except ValueError:
        vals = []
    if not vals or any(not lo <= v <= hi for v in vals):
        raise SystemExit(f"{name} takes comma-separated integers in {lo}..{hi}, got {os.environ.get(name)!r}")
    return vals


MS = _env_ints("SMALLM_MS", "1,4,16", 1, 16)                  # the Gluon small-M path's range
ROUNDS = _env_ints("SMALLM_ROUNDS", "2", 1, 20)[0]
VARIANTS = _env_list("SMALLM_VARIANTS", "") or None           # None: every candidate
GEMLITE = os.environ.get("SMALLM_GEMLITE", "1") != "0"


def check_variants() -> None:
    """SMALLM_VARIANTS must name candidates (a typo would silently time nothing but `shipped`)."""
    from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_GRID_CANDIDATES

    unknown = sorted(set(VARIANTS or ()) - set(SMALL_GRID_CANDIDATES))
    if unknown:
        raise SystemExit(f"SMALLM_VARIANTS names no candidate {unknown}: take names of fp4_gemm_gluon_config."
                         f"SMALL_GRID_CANDIDATES ({', '.join(SMALL_GRID_CANDIDATES)})")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"4096x12288,12288x4096" (K x N each) -> [(4096, 12288), (12288, 4096)]."""
    try:
        shapes = [tuple(int(v) for v in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes takes K x N pairs like 4096x12288,12288x4096, got {text!r}")
    return shapes


def all_variants(fmt: str) -> dict:
    """name -> GluonConfig (None: the launcher's own choice, `config_for`) for `fmt`, before any per-point filter:
    `shipped` and the candidates of VARIANTS (SMALLM_VARIANTS; None: all) that apply to `fmt`."""
    from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_GRID_CANDIDATES

    return {"shipped": None, **{n: c for n, (c, fmts) in SMALL_GRID_CANDIDATES.items()
                                if fmt in fmts and (VARIANTS is None or n in VARIANTS)}}


def variants(fmt: str, K: int, N: int, M: int, sms: int = 132) -> tuple[dict, dict]:
    """(timed, excluded) at one point: `timed` name -> config as in all_variants, less the candidates whose launch
    (config at its evened split) an earlier variant already makes (`shipped` first: same kernel, same bits) and those
    needing more than WAVES waves of resident programs (SMs x CTAs per SM; e.g. split 16 at 4096x12288: 8 waves);
    `excluded` name -> why."""
    from trace_rl.kernels.fp4_gemm_gluon_config import GluonConfig
    from trace_rl.kernels.hopper_fp4 import padded_shape

    pad = padded_shape(N, K)
    timed, excluded, seen = {}, {}, {}
    for name, cfg in all_variants(fmt).items():
        f = _launch_facts(M, fmt, pad, cfg, sms)
        # the launch: the config's fields but its split_k (0 = auto) and block_m, the token tile and split it runs
        # at (qn_split8's block_m 8 is q_split8's launch at M <= 8)
        launch = (tuple(sorted((k, v) for k, v in f["config"].items() if k not in ("split_k", "block_m"))),
                  f["block_m"], f["split"])
        resident = sms * GluonConfig(**f["config"]).ctas_per_sm(f["block_m"], fmt)
        if launch in seen:
            excluded[name] = f"same launch as {seen[launch]}"
        elif name != "shipped" and f["programs"] > WAVES * resident:
            excluded[name] = f"{f['programs']} programs > {WAVES} waves of {resident}"
        else:
            seen[launch] = name
            timed[name] = cfg
    return timed, excluded


def _weights(fmt: str, K: int, N: int, n: int, seed: int = 0) -> tuple[list, list]:
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


def _inputs(fmt: str, K: int, M: int, seed: int):
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
    """Worker (spawn): every launch of one (format, variant) at every shape and M where `variants` times it, both
    acts (+ the fin=False check launch), or gemlite's kernels at every M (`("gemlite", "", shapes)`), to fill
    Triton's cache."""
    fmt, name, shapes = job
    try:
        import torch

        if fmt == "gemlite":
            from kernel_baselines import gemlite_available, gemlite_int4_linear

            ok, why = gemlite_available()
            if not ok or not GEMLITE:
                return ""
            for K, N in shapes:
                layer = gemlite_int4_linear(torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02)
                for M in MS:
                    layer(torch.randn(M, K, device=DEV, dtype=torch.bfloat16))
            torch.cuda.synchronize()
            return ""
        from trace_rl.kernels.fp4_gemm_gluon import config_for, fp4_matmul_gluon

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for K, N in shapes:
            if not any(name in variants(fmt, K, N, M, sms)[0] for M in MS):
                continue
            (_, ), (h, ) = _weights(fmt, K, N, 1)
            cfg = all_variants(fmt)[name]
            for M in MS:
                if name not in variants(fmt, K, N, M, sms)[0]:
                    continue
                x, xq, rs = _inputs(fmt, K, M, 1)
                _call(x, h, cfg, None)
                _call(xq, h, cfg, rs)
                used = cfg or config_for(M, fmt, h.padded[1], h.padded[0])
                split = _launch_facts(M, fmt, h.padded, cfg, sms)["split"]
                fp4_matmul_gluon(x, h, replace(used, fin=False, split_k=split))
            del h
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job[0]} {job[1]} {job[2]}: {e!r}"[:300]


def precompile(shapes, timeout_s: float = 40.0, workers: int = 12) -> tuple[list[str], list[tuple]]:
    """Every job of `_compile_job` in `workers` spawned processes; a job still running after `timeout_s` (a kernel
    that never finishes would hang the run) has its workers killed. Returns (errors, hung jobs)."""
    from concurrent.futures import ProcessPoolExecutor, wait
    from multiprocessing import get_context

    # `shipped` compiles another split (and config) per shape: one job per shape, submitted first (the longest)
    jobs = [(fmt, "shipped", [shape]) for shape in shapes for fmt in FMTS] + [("gemlite", "", shapes)] + \
        [(fmt, name, shapes) for fmt in FMTS for name in all_variants(fmt) if name != "shipped"]
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"))
    futs = {pool.submit(_compile_job, j): j for j in jobs}
    done, pending = wait(futs, timeout=timeout_s)
    errors = [e for e in (f.result() for f in done) if e]
    if pending:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return errors, sorted((j[0], j[1], "+".join(f"{k}x{n}" for k, n in j[2])) for j in map(futs.get, pending))


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


def _point(fmt, K, N, M, act, ps, hs, w_bf16, gl_layers, gl_reason, graph_us, errors) -> dict:
    """One (shape, format, M, act) point: checks, then ROUNDS rounds of timing."""
    import torch
    import torch.nn.functional as F
    from kernel_baselines import interleaved_rounds, round_stats

    from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, fp4_matmul_gluon, launch_grid

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, xq, rs = _inputs(fmt, K, M, 1000 + M)
    inp, rs = (x, None) if act == "w4a16" else (xq, rs)
    ref = inp.double() @ ps[0].q.dequantize().double().T
    if rs is not None:
        ref = ref * rs.double()[:, None]
    vars_, excluded = variants(fmt, K, N, M, sms)
    row = {"fmt": fmt, "K": K, "N": N, "M": M, "act": act, "variants": {}, "excluded": excluded}
    outs = {}
    for name, cfg in vars_.items():
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
            errors.append(f"{fmt} {K}x{N} M {M} {act} {name}: {e!r}"[:400])
    base = outs.get("shipped")
    for name, y in outs.items():
        if base is not None:
            v = row["variants"][name]
            v["bit_identical_vs_shipped"] = bool(torch.equal(y, base))
            d = (y.float() - base.float()).abs()
            v["max_abs_diff_vs_shipped"] = d.max().item()
            v["rel_vs_shipped"] = _rel(y, base)
    del ref, outs, base
    timed = {n: (lambda cfg=cfg: [lambda h=h: _call(inp, h, cfg, rs) for h in hs])
             for n, cfg in vars_.items() if row["variants"][n].get("ok")}
    bf = [w_bf16[i % len(w_bf16)] for i in range(len(hs))]
    timed["cublas_bf16"] = lambda: [lambda w=w: F.linear(x, w) for w in bf]      # the same bf16 x in both acts
    if act == "w4a16":
        if gl_layers:
            timed["gemlite_int4"] = lambda: [lambda g=g: g(x) for g in gl_layers]
        else:
            row["gemlite_int4"] = gl_reason
    row.update(round_stats(interleaved_rounds(timed, lambda n: graph_us(timed[n]()), ROUNDS, errors,
                                              f"{fmt} {K}x{N} M {M} {act}")))
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
    shapes = args.shapes
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=torch.cuda.get_device_properties(0).multi_processor_count),
           "shapes": [{"K": K, "N": N} for K, N in shapes], "rows": [], "skipped": [], "errors": [],
           "weight_copies": {}}
    save = json_saver(res, args.out)
    gl_ok, gl_info = gemlite_available() if GEMLITE else (False, "off (SMALLM_GEMLITE=0)")
    res["gemlite"] = gl_info if gl_ok else {"unavailable": gl_info}
    res["sweep"] = {"Ms": MS, "rounds": ROUNDS, "variants": VARIANTS or "all", "gemlite": GEMLITE}
    save()
    for K, N in shapes:
        if time.time() - start > args.budget_s:
            res["skipped"] += [{"K": K, "N": N, "fmt": f, "M": M, "act": a} for M in MS for f in FMTS for a in ACTS]
            continue
        torch.manual_seed(0)
        n = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                  for _ in range(weight_copies(N * K * 2))]
        gl_layers, gl_reason = [], (f"gemlite unavailable: {gl_info}" if not gl_ok else "")
        if gl_ok:
            try:
                gl_layers = [gemlite_int4_linear(w_bf16[i % len(w_bf16)]) for i in range(n)]
            except Exception as e:   # noqa: BLE001
                gl_reason = f"gemlite layer failed: {e!r}"[:300]
                res["errors"].append(f"{K}x{N}: {gl_reason}")
        res["weight_copies"][f"{K}x{N}"] = n
        weights = {}
        # M = 1 first for both formats (the points the issue misses most), then 4, then 16
        for M, fmt in [(M, fmt) for M in MS for fmt in FMTS]:
            for act in ACTS:
                if time.time() - start > args.budget_s:
                    res["skipped"].append({"K": K, "N": N, "fmt": fmt, "M": M, "act": act})
                    continue
                if fmt not in weights:
                    weights[fmt] = _weights(fmt, K, N, n)
                ps, hs = weights[fmt]
                row = _point(fmt, K, N, M, act, ps, hs, w_bf16, gl_layers, gl_reason, graph_us, res["errors"])
                res["rows"].append(row)
                save()
                print({k: row.get(k) for k in ("fmt", "K", "N", "M", "act", "best", "best_us", "best_vs_shipped",
                                               "best_vs_cublas_bf16")}, row["us"], flush=True)
        del weights, w_bf16, gl_layers
        torch.cuda.empty_cache()
    res["total_s"] = round(time.time() - start, 1)
    save()


def dry(shapes=None, sms: int = 132) -> dict:
    """Per shape, format and M, each variant's launch (config, split, programs, columns per program) on `sms` SMs and
    the excluded ones: no GPU."""
    from trace_rl.kernels.hopper_fp4 import padded_shape

    out = {}
    for K, N in shapes or SHAPES:
        pad = padded_shape(N, K)
        out[f"{K}x{N}"] = {fmt: {M: {**{n: _launch_facts(M, fmt, pad, c, sms)
                                        for n, c in variants(fmt, K, N, M, sms)[0].items()},
                                     "excluded": variants(fmt, K, N, M, sms)[1]} for M in MS} for fmt in FMTS}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="smallm.json")
    ap.add_argument("--shapes", default=",".join(f"{K}x{N}" for K, N in SHAPES),
                    help=f"K x N weight shapes, comma-separated, measured in this order (smallwide: {WIDE_SHAPES})")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new point after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    ap.add_argument("--dry", action="store_true", help="print each variant's launch on 132 SMs (no GPU) and exit")
    args = ap.parse_args()
    args.shapes = parse_shapes(args.shapes)
    check_variants()
    if args.dry:
        import json

        plan = dry(args.shapes)
        with open(args.out, "w") as f:
            json.dump(plan, f, indent=1)
        for shape, per_fmt in plan.items():
            for fmt, per_m in per_fmt.items():
                for M, vs in per_m.items():
                    print(shape, fmt, M, {n: (v["split"], v["programs"], v["columns_per_program"])
                                          for n, v in vs.items() if n != "excluded"}, "excluded:", vs["excluded"])
        return 0
    if args.precompile_only:
        import gemm_compute as gcb

        return gcb.precompile_exit(lambda: precompile(args.shapes, args.precompile_timeout_s))
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
